//go:build amd64 && !purego

package sha256x2

import (
	"crypto/sha256"
	"testing"
)

// TestSum2Fallback runs the crypto/sha256 path on a SHA-NI machine too.
func TestSum2Fallback(t *testing.T) {
	defer func(on bool) { interleaved = on }(interleaved)
	interleaved = false
	a, b := make([]byte, 1000), make([]byte, 70)
	for i := range a {
		a[i] = byte(i * 7)
	}
	da, db := Sum2(a, b)
	if da != sha256.Sum256(a) || db != sha256.Sum256(b) {
		t.Fatal("fallback Sum2 differs from crypto/sha256")
	}
}
