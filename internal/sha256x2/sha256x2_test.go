package sha256x2

import (
	"bytes"
	"crypto/sha256"
	"math/rand/v2"
	"os"
	"os/exec"
	"testing"
)

// TestSum2 compares Sum2 with crypto/sha256 for every pair of lengths up
// to 300 bytes (every split of whole blocks and tails around the 64-byte
// boundaries and the padding's 56-byte edge), longer random pairs, and
// equal and overlapping inputs.
func TestSum2(t *testing.T) {
	if !interleaved {
		t.Log("no SHA-NI here: Sum2 is two crypto/sha256 sums")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	check := func(a, b []byte) {
		t.Helper()
		da, db := Sum2(a, b)
		if da != sha256.Sum256(a) || db != sha256.Sum256(b) {
			t.Fatalf("Sum2 of %d and %d bytes differs from crypto/sha256", len(a), len(b))
		}
	}
	for la := 0; la <= 300; la++ {
		for lb := 0; lb <= 300; lb++ {
			check(buf[:la], buf[500:500+lb])
		}
	}
	for range 200 {
		la, lb := rng.IntN(1<<19), rng.IntN(1<<19)
		oa, ob := rng.IntN(len(buf)-la), rng.IntN(len(buf)-lb)
		check(buf[oa:oa+la], buf[ob:ob+lb])
	}
	check(buf[:36<<10], buf[:36<<10])        // the same message twice
	check(buf[:32<<10], buf[100:100+32<<10]) // overlapping
	check(nil, buf[:4096])
}

func FuzzSum2(f *testing.F) {
	f.Add([]byte("abc"), []byte(""))
	f.Add(make([]byte, 64), make([]byte, 119))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		da, db := Sum2(a, b)
		if da != sha256.Sum256(a) || db != sha256.Sum256(b) {
			t.Fatalf("Sum2 of %d and %d bytes differs from crypto/sha256", len(a), len(b))
		}
	})
}

// BenchmarkSum2 hashes a small job's outputs for two jobs (dx 32 KiB,
// dw 4 KiB each) with Sum2 and with four crypto/sha256 sums.
func BenchmarkSum2(b *testing.B) {
	dx1, dx2 := make([]byte, 32<<10), make([]byte, 32<<10)
	dw1, dw2 := make([]byte, 4<<10), make([]byte, 4<<10)
	b.Run("sha256x2", func(b *testing.B) {
		b.SetBytes(2 * (32 + 4) << 10)
		for b.Loop() {
			Sum2(dx1, dx2)
			Sum2(dw1, dw2)
		}
	})
	b.Run("crypto_sha256", func(b *testing.B) {
		b.SetBytes(2 * (32 + 4) << 10)
		for b.Loop() {
			sha256.Sum256(dx1)
			sha256.Sum256(dx2)
			sha256.Sum256(dw1)
			sha256.Sum256(dw2)
		}
	})
}

func TestSum2Allocs(t *testing.T) {
	a, b := make([]byte, 32<<10), make([]byte, 4<<10+70)
	if n := testing.AllocsPerRun(100, func() { Sum2(a, b) }); n != 0 {
		t.Errorf("Sum2 allocates %v times a call", n)
	}
}

// TestGenerated: block_amd64.s is what gen.py writes (skipped without
// python3).
func TestGenerated(t *testing.T) {
	py := os.Getenv("RMSGRAD_PYTHON")
	if py == "" {
		py = "python3"
	}
	if _, err := exec.LookPath(py); err != nil {
		t.Skip("no python3: ", err)
	}
	want, err := exec.Command(py, "gen.py").Output()
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("block_amd64.s")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("block_amd64.s differs from gen.py's output: run go generate ./internal/sha256x2")
	}
}
