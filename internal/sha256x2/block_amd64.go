//go:build amd64 && !purego

package sha256x2

import "golang.org/x/sys/cpu"

//go:generate sh -c "python3 gen.py > block_amd64.s"

// interleaved selects block2: SHA-NI with the AVX encodings gen.py uses.
// A variable so that tests can run the fallback on a SHA-NI machine.
var interleaved = hasSHA() && cpu.X86.HasAVX && cpu.X86.HasSSE41 && cpu.X86.HasSSSE3

// block2 compresses n 64-byte blocks of p1 into h1 and of p2 into h2
// (block_amd64.s, written by gen.py).
//
//go:noescape
func block2(h1, h2 *[8]uint32, p1, p2 *byte, n int)

// hasSHA reports CPUID leaf 7's SHA bit (golang.org/x/sys/cpu has no
// field for it on x86).
func hasSHA() bool
