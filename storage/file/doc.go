// Package file is the local-disk Store: file:///abs/path URIs under one
// allow-listed root directory. It is the zero-setup default and serves
// hosts that share a mount.
//
// Every open goes through an os.Root on the configured directory, so ".."
// and symlinks that lead outside the root are refused by the kernel-facing
// path walk itself (not by a check that a concurrent rename could race);
// relative symlinks that stay inside the root work (os.Root refuses absolute
// symlinks even when they point inside it). Writes go to a temp file in the
// destination directory, are fsynced and renamed over the target, so a
// reader sees the old file or the whole new one.
package file
