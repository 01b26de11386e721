//go:build !amd64 || purego

package sha256x2

const interleaved = false

func block2(h1, h2 *[8]uint32, p1, p2 *byte, n int) {
	panic("sha256x2: no interleaved compression here")
}
