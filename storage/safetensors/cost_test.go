package safetensors

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// adversarial builds a header of about n bytes of one of the shapes that
// make a parser allocate most per byte, and the data length it describes.
func adversarial(kind string, n int) ([]byte, int64) {
	var b strings.Builder
	b.WriteString("{")
	var off int64
	switch kind {
	case "tiny-tensors", "tiny-tensors-escaped":
		for i := 0; b.Len() < n-200; i++ {
			name := fmt.Sprintf("t%d", i)
			if kind == "tiny-tensors-escaped" && b.Len() > n-400 {
				name = `z\u0041` // an escape at the end: the fast parser gives up late
			}
			fmt.Fprintf(&b, `"%s":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]},`, name, off, off+1)
			off++
		}
	case "metadata-keys":
		b.WriteString(`"__metadata__":{`)
		for i := 0; b.Len() < n-200; i++ {
			fmt.Fprintf(&b, `"k%d":"v",`, i)
		}
		b.WriteString(`"end":"v"},`)
	case "metadata-value":
		fmt.Fprintf(&b, `"__metadata__":{"k":"%s"},`, strings.Repeat("a", n-200))
	case "long-shape":
		b.WriteString(`"x":{"dtype":"U8","shape":[`)
		for b.Len() < n-200 {
			b.WriteString("1,")
		}
		b.WriteString(`1],"data_offsets":[0,1]},`)
		off = 1
	}
	fmt.Fprintf(&b, `"last":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}}`, off, off+1)
	return []byte(b.String()), off + 1
}

// TestParseCost: for headers built to make the parsers allocate most per
// byte, below and above SlowParseMax, the header's bytes plus everything
// ParseHeader allocates stay within ParseCost, the figure a reader charges
// to its header budget.
func TestParseCost(t *testing.T) {
	for _, n := range []int{SlowParseMax - 4096, 4 * SlowParseMax} {
		for _, kind := range []string{"tiny-tensors", "tiny-tensors-escaped", "metadata-keys", "metadata-value", "long-shape"} {
			h, data := adversarial(kind, n)
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			_, err := ParseHeader(h, PrefixSize+int64(len(h))+data)
			runtime.ReadMemStats(&m1)
			used := int64(len(h)) + int64(m1.TotalAlloc-m0.TotalAlloc)
			if used > ParseCost(int64(len(h))) {
				t.Errorf("%s, %d bytes: header + allocations %d bytes (%.1f x), over ParseCost %d (err %v)", kind, len(h), used, float64(used)/float64(len(h)), ParseCost(int64(len(h))), err)
			}
			t.Logf("%-21s %8d bytes: %.1f x (parse error: %v)", kind, len(h), float64(used)/float64(len(h)), err)
		}
	}
}
