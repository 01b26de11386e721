#!/usr/bin/env bash
# Prints the path of a libnvrtc that the CUDA backend's compile can load on
# a machine without a GPU or a CUDA toolkit (cuda.TestKernelsNVRTC compiles
# the kernels with it; NVRTC needs no device), with cuobjdump and nvdisasm
# beside it (the test reads the kernels' SASS with them). It unpacks Debian 12's
# libnvrtc11.2 and libnvrtc-builtins11.8 packages and the cuobjdump and
# nvdisasm of nvidia-cuda-toolkit (CUDA 11.8, from the non-free component) into a cache
# directory, once, without installing them and without touching the
# system's apt sources: apt reads a private source list into private
# lists. Needs apt-get and dpkg-deb (Debian, Ubuntu).
#
#   RMSGRAD_TEST_NVRTC=$(scripts/nvrtc.sh) go test -run TestKernelsNVRTC ./cuda/
set -euo pipefail

dir=${RMSGRAD_NVRTC_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rmsgrad/nvrtc-debian12}
lib=$dir/libnvrtc.so.11.2
if [ -f "$lib" ] && [ -f "$dir/libnvrtc-builtins.so.11.8" ] && [ -x "$dir/cuobjdump" ] && [ -x "$dir/nvdisasm" ]; then
	echo "$lib"
	exit 0
fi
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || {
	echo "nvrtc.sh: needs apt-get and dpkg-deb" >&2
	exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/archives/partial" "$tmp/x"
cat >"$tmp/sources.list" <<'SRC'
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm non-free
SRC
apt_opts=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
	-o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp" -o "Dir::Cache::archives=$tmp/archives"
	-o "Debug::NoLocking=1" -o "APT::Sandbox::User=root")
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$tmp" && apt-get "${apt_opts[@]}" -qq download libnvrtc11.2 libnvrtc-builtins11.8 nvidia-cuda-toolkit >&2)
for deb in "$tmp"/libnvrtc*.deb; do
	echo "nvrtc.sh: unpacking $(basename "$deb")" >&2
	dpkg-deb -x "$deb" "$tmp/x"
done
# Of the toolkit (84 MB), only cuobjdump and the nvdisasm it runs for
# SASS (libc alone).
echo "nvrtc.sh: taking cuobjdump and nvdisasm from $(basename "$tmp"/nvidia-cuda-toolkit_*.deb)" >&2
dpkg-deb --fsys-tarfile "$tmp"/nvidia-cuda-toolkit_*.deb | tar -x -C "$tmp/x" ./usr/bin/cuobjdump ./usr/bin/nvdisasm
mkdir -p "$dir"
cp -a "$tmp"/x/usr/lib/x86_64-linux-gnu/libnvrtc* "$tmp/x/usr/bin/cuobjdump" "$tmp/x/usr/bin/nvdisasm" "$dir/"
test -f "$lib" && test -f "$dir/libnvrtc-builtins.so.11.8" && test -x "$dir/cuobjdump" && test -x "$dir/nvdisasm" || {
	echo "nvrtc.sh: the packages did not hold $lib, its builtins, cuobjdump and nvdisasm" >&2
	exit 1
}
echo "$lib"
