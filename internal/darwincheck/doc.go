// Command darwincheck type-checks Go packages for another platform (by
// default darwin/arm64 with cgo) on this machine, without a C compiler or the
// target's SDK: `go list -deps -json` under the target's GOOS, GOARCH and
// CGO_ENABLED=1 selects the files, and go/types with FakeImportC checks every
// package from source in dependency order (the standard library and the
// module cache included).
//
// It exists so that the darwin-only Metal backend (metal/, darwinkit) is
// checked on Linux in `make test`:
//
//	go run ./internal/darwincheck ./metal/...
//
// exits 1 and prints each type error (position and message) if there is
// any. With FakeImportC, references to cgo's C package are not checked (no
// C headers are read): what is checked is all the Go, including every call
// into darwinkit's generated bindings.
package main
