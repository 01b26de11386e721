package sha256x2

import (
	"crypto/sha256"
	"encoding/binary"
)

// Size is the length of a digest.
const Size = sha256.Size

// iv is SHA-256's initial state.
var iv = [8]uint32{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19}

// Sum2 returns the SHA-256 digests of a and b.
func Sum2(a, b []byte) (da, db [Size]byte) {
	if !interleaved {
		return sha256.Sum256(a), sha256.Sum256(b)
	}
	ha, hb := iv, iv
	na, nb := len(a)/64, len(b)/64
	n := min(na, nb)
	if n > 0 {
		block2(&ha, &hb, &a[0], &b[0], n)
	}
	// The longer message's other blocks: one chain is as fast alone as
	// beside a second, so the second lane just repeats the first's data
	// into a state nobody reads.
	var spare [8]uint32
	if na > n {
		block2(&ha, &spare, &a[64*n], &a[64*n], na-n)
	}
	if nb > n {
		block2(&hb, &spare, &b[64*n], &b[64*n], nb-n)
	}
	var fa, fb [128]byte
	ka, kb := pad(&fa, a[64*na:], len(a)), pad(&fb, b[64*nb:], len(b))
	block2(&ha, &hb, &fa[0], &fb[0], 1)
	if ka == 2 && kb == 2 {
		block2(&ha, &hb, &fa[64], &fb[64], 1)
	} else if ka == 2 {
		block2(&ha, &spare, &fa[64], &fa[64], 1)
	} else if kb == 2 {
		block2(&hb, &spare, &fb[64], &fb[64], 1)
	}
	for i := range 8 {
		binary.BigEndian.PutUint32(da[4*i:], ha[i])
		binary.BigEndian.PutUint32(db[4*i:], hb[i])
	}
	return da, db
}

// pad writes a message's last bytes (tail, under 64) and SHA-256's padding
// for a message of n bytes into f and returns how many 64-byte blocks that
// takes: 0x80, zeros, then n in bits as a big-endian uint64.
func pad(f *[128]byte, tail []byte, n int) int {
	copy(f[:], tail)
	f[len(tail)] = 0x80
	k := 1
	if len(tail) >= 56 {
		k = 2
	}
	binary.BigEndian.PutUint64(f[64*k-8:], uint64(n)<<3)
	return k
}
