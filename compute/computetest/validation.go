package computetest

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/rmsgrad/rmsgrad/compute"
)

// RunValidation checks that every invalid dispatch is rejected through
// compute.CommandBuffer with an *ArgError naming the kernel and argument,
// one subtest per error, and that nothing invalid reaches the backend.
func RunValidation(t *testing.T, open func(t *testing.T) compute.Backend) {
	b := open(t)
	const rows, dim = 3, 5
	alloc := func(t *testing.T, dt compute.DType, shape ...int) compute.Buffer {
		t.Helper()
		buf, err := b.Alloc(dt, shape...)
		if err != nil {
			t.Fatalf("Alloc(%s, %v): %v", dt, shape, err)
		}
		t.Cleanup(buf.Release)
		return buf
	}
	type set struct{ x, w, dy, r, dx, dw compute.Buffer }
	good := func(t *testing.T) set {
		return set{alloc(t, compute.F32, rows, dim), alloc(t, compute.F32, dim), alloc(t, compute.F32, rows, dim),
			alloc(t, compute.F32, rows), alloc(t, compute.F32, rows, dim), alloc(t, compute.F32, dim)}
	}
	inv := func(cb *compute.CommandBuffer, s set, p []float32, r, d int) error {
		return cb.RMSInv(s.x, s.r, p, r, d)
	}
	dxf := func(cb *compute.CommandBuffer, s set, p []float32, r, d int) error {
		return cb.DX(s.x, s.w, s.dy, s.r, s.dx, p, r, d)
	}
	dwf := func(cb *compute.CommandBuffer, s set, p []float32, r, d int) error {
		return cb.DW(s.x, s.dy, s.r, s.dw, p, r, d)
	}
	type kern struct {
		k      compute.Kernel
		call   func(*compute.CommandBuffer, set, []float32, int, int) error
		params func(rows, dim int) []float32
	}
	kerns := []kern{
		{compute.KernelRMSInv, inv, func(r, d int) []float32 { return compute.RMSInvParams(1e-5, d) }},
		{compute.KernelDX, dxf, func(r, d int) []float32 { return compute.DXParams(d, 1e-5) }},
		{compute.KernelDW, dwf, func(r, d int) []float32 { return compute.DWParams(d, r) }},
	}
	// prepare records the RMSInv and barrier that DX and DW legally need, so
	// the error under test is the only one.
	prepare := func(t *testing.T, k compute.Kernel, s set) *compute.CommandBuffer {
		cb := compute.NewCommandBuffer(b)
		if k != compute.KernelRMSInv {
			if err := cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
				t.Fatalf("valid RMSInv: %v", err)
			}
			cb.Barrier()
		}
		return cb
	}
	for _, kn := range kerns {
		t.Run(string(kn.k), func(t *testing.T) {
			t.Run("Valid", func(t *testing.T) {
				s := good(t)
				cb := prepare(t, kn.k, s)
				if err := kn.call(cb, s, kn.params(rows, dim), rows, dim); err != nil {
					t.Fatalf("valid dispatch rejected: %v", err)
				}
				if _, err := cb.Commit(context.Background()); err != nil {
					t.Fatalf("Commit: %v", err)
				}
			})
			for _, c := range []struct {
				name, arg  string
				rows, dim  int
				params     []float32
				useDefault bool
			}{
				{"RowsZero", "rows", 0, dim, nil, true},
				{"RowsNegative", "rows", -1, dim, nil, true},
				{"DimZero", "dim", rows, 0, nil, true},
				{"Overflow", "rows*dim", 1 << 31, 1 << 31, nil, true},
				{"OverflowInt32", "rows*dim", 1 << 16, 1 << 15, nil, true},
				{"ParamsShort", "params", rows, dim, []float32{5}, false},
				{"ParamsNil", "params", rows, dim, nil, false},
			} {
				t.Run(c.name, func(t *testing.T) {
					s := good(t)
					cb := prepare(t, kn.k, s)
					p := c.params
					if c.useDefault {
						p = kn.params(rows, dim)
					}
					errorIs(t, kn.call(cb, s, p, c.rows, c.dim), kn.k, c.arg)
				})
			}
			// Element counts and dtypes of each buffer the kernel reads or writes.
			type bufCase struct {
				arg string
				set func(t *testing.T, s *set, dt compute.DType, extra int)
			}
			x := bufCase{"x", func(t *testing.T, s *set, dt compute.DType, e int) { s.x = alloc(t, dt, rows*dim+e) }}
			w := bufCase{"w", func(t *testing.T, s *set, dt compute.DType, e int) { s.w = alloc(t, dt, dim+e) }}
			dy := bufCase{"dy", func(t *testing.T, s *set, dt compute.DType, e int) { s.dy = alloc(t, dt, rows*dim+e) }}
			r := bufCase{"r", func(t *testing.T, s *set, dt compute.DType, e int) { s.r = alloc(t, dt, rows+e) }}
			dx := bufCase{"dx", func(t *testing.T, s *set, dt compute.DType, e int) { s.dx = alloc(t, dt, rows*dim+e) }}
			dw := bufCase{"dw", func(t *testing.T, s *set, dt compute.DType, e int) { s.dw = alloc(t, dt, dim+e) }}
			var bufs []bufCase
			switch kn.k {
			case compute.KernelRMSInv:
				bufs = []bufCase{x, r}
			case compute.KernelDX:
				bufs = []bufCase{x, w, dy, r, dx}
			case compute.KernelDW:
				bufs = []bufCase{x, dy, r, dw}
			}
			for _, bc := range bufs {
				for _, e := range []int{-1, 1} {
					t.Run("Count_"+bc.arg+map[int]string{-1: "Short", 1: "Long"}[e], func(t *testing.T) {
						s := good(t)
						cb := prepare(t, kn.k, s)
						bc.set(t, &s, compute.F32, e)
						errorIs(t, kn.call(cb, s, kn.params(rows, dim), rows, dim), kn.k, bc.arg+" element count")
					})
				}
				// A dtype no kernel computes, on a buffer that is otherwise
				// right: the backend's buffer seen through a wrapper.
				t.Run("DType_"+bc.arg+"_F64", func(t *testing.T) {
					s := good(t)
					cb := prepare(t, kn.k, s)
					bc.set(t, &s, compute.F32, 0)
					p := map[string]*compute.Buffer{"x": &s.x, "w": &s.w, "dy": &s.dy, "r": &s.r, "dx": &s.dx, "dw": &s.dw}[bc.arg]
					*p = otherDType{*p, "F64"}
					errorIs(t, kn.call(cb, s, kn.params(rows, dim), rows, dim), kn.k, bc.arg+" dtype")
				})
				// Half dtypes: r must be F32; every other tensor may be half.
				for _, dt := range []compute.DType{compute.F16, compute.BF16} {
					t.Run("DType_"+bc.arg+"_"+string(dt), func(t *testing.T) {
						s := good(t)
						cb := prepare(t, kn.k, s)
						bc.set(t, &s, dt, 0)
						err := kn.call(cb, s, kn.params(rows, dim), rows, dim)
						if bc.arg == "r" {
							errorIs(t, err, kn.k, "r dtype")
						} else if err != nil {
							t.Fatalf("%s of %s rejected: %v", bc.arg, dt, err)
						}
					})
				}
				t.Run("Nil_"+bc.arg, func(t *testing.T) {
					s := good(t)
					cb := prepare(t, kn.k, s)
					var zero set
					switch bc.arg {
					case "x":
						s.x = zero.x
					case "w":
						s.w = zero.w
					case "dy":
						s.dy = zero.dy
					case "r":
						s.r = zero.r
					case "dx":
						s.dx = zero.dx
					case "dw":
						s.dw = zero.dw
					}
					errorIs(t, kn.call(cb, s, kn.params(rows, dim), rows, dim), kn.k, bc.arg)
				})
			}
		})
	}

	// Parameter values.
	paramCases := []struct {
		name string
		k    compute.Kernel
		arg  string
		call func(cb *compute.CommandBuffer, s set) error
	}{
		{"EpsZero", compute.KernelRMSInv, "params[0] (eps)", func(cb *compute.CommandBuffer, s set) error {
			return cb.RMSInv(s.x, s.r, compute.RMSInvParams(0, dim), rows, dim)
		}},
		{"EpsNegative", compute.KernelRMSInv, "params[0] (eps)", func(cb *compute.CommandBuffer, s set) error {
			return cb.RMSInv(s.x, s.r, compute.RMSInvParams(-1e-5, dim), rows, dim)
		}},
		{"EpsNaN", compute.KernelRMSInv, "params[0] (eps)", func(cb *compute.CommandBuffer, s set) error {
			return cb.RMSInv(s.x, s.r, compute.RMSInvParams(float32(math.NaN()), dim), rows, dim)
		}},
		{"EpsInf", compute.KernelRMSInv, "params[0] (eps)", func(cb *compute.CommandBuffer, s set) error {
			return cb.RMSInv(s.x, s.r, compute.RMSInvParams(float32(math.Inf(1)), dim), rows, dim)
		}},
		{"RMSInvDimMismatch", compute.KernelRMSInv, "params[1] (dim)", func(cb *compute.CommandBuffer, s set) error {
			return cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim+1), rows, dim)
		}},
		{"DXDimMismatch", compute.KernelDX, "params[0] (dim)", func(cb *compute.CommandBuffer, s set) error {
			return cb.DX(s.x, s.w, s.dy, s.r, s.dx, compute.DXParams(dim-1, 1e-5), rows, dim)
		}},
		{"DXEpsZero", compute.KernelDX, "params[1] (eps)", func(cb *compute.CommandBuffer, s set) error {
			return cb.DX(s.x, s.w, s.dy, s.r, s.dx, compute.DXParams(dim, 0), rows, dim)
		}},
		{"DXEpsNaN", compute.KernelDX, "params[1] (eps)", func(cb *compute.CommandBuffer, s set) error {
			return cb.DX(s.x, s.w, s.dy, s.r, s.dx, compute.DXParams(dim, float32(math.NaN())), rows, dim)
		}},
		{"DWDimMismatch", compute.KernelDW, "params[0] (dim)", func(cb *compute.CommandBuffer, s set) error {
			return cb.DW(s.x, s.dy, s.r, s.dw, compute.DWParams(dim+1, rows), rows, dim)
		}},
		{"DWRowsMismatch", compute.KernelDW, "params[1] (rows)", func(cb *compute.CommandBuffer, s set) error {
			return cb.DW(s.x, s.dy, s.r, s.dw, compute.DWParams(dim, rows+1), rows, dim)
		}},
		// Aliasing: an output that is also an input.
		{"AliasDXisX", compute.KernelDX, "dx", func(cb *compute.CommandBuffer, s set) error {
			return cb.DX(s.x, s.w, s.dy, s.r, s.x, compute.DXParams(dim, 1e-5), rows, dim)
		}},
		{"AliasDXisDY", compute.KernelDX, "dx", func(cb *compute.CommandBuffer, s set) error {
			return cb.DX(s.x, s.w, s.dy, s.r, s.dy, compute.DXParams(dim, 1e-5), rows, dim)
		}},
	}
	for _, c := range paramCases {
		t.Run(c.name, func(t *testing.T) {
			s := good(t)
			cb := prepare(t, c.k, s)
			errorIs(t, c.call(cb, s), c.k, c.arg)
		})
	}
	t.Run("AliasRMSInvSameSize", func(t *testing.T) {
		// With rows*dim == rows (dim 1), x and r have the same size, so only
		// the alias check can reject r == x.
		x := alloc(t, compute.F32, 4, 1)
		cb := compute.NewCommandBuffer(b)
		errorIs(t, cb.RMSInv(x, x, compute.RMSInvParams(1e-5, 1), 4, 1), compute.KernelRMSInv, "r")
	})
	t.Run("AliasDWisW", func(t *testing.T) {
		s := good(t)
		cb := prepare(t, compute.KernelDW, s)
		// dw must not be r either when sizes agree: rows == dim here.
		x, dy, r := alloc(t, compute.F32, 4, 4), alloc(t, compute.F32, 4, 4), alloc(t, compute.F32, 4)
		errorIs(t, cb.DW(x, dy, r, r, compute.DWParams(4, 4), 4, 4), compute.KernelDW, "dw")
	})
	// Missing barriers: DX or DW reading an r that an RMSInv wrote since the
	// last barrier.
	t.Run("MissingBarrierDX", func(t *testing.T) {
		s := good(t)
		cb := compute.NewCommandBuffer(b)
		if err := cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
			t.Fatal(err)
		}
		errorIs(t, cb.DX(s.x, s.w, s.dy, s.r, s.dx, compute.DXParams(dim, 1e-5), rows, dim), compute.KernelDX, "r")
	})
	t.Run("MissingBarrierDW", func(t *testing.T) {
		s := good(t)
		cb := compute.NewCommandBuffer(b)
		if err := cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
			t.Fatal(err)
		}
		errorIs(t, cb.DW(s.x, s.dy, s.r, s.dw, compute.DWParams(dim, rows), rows, dim), compute.KernelDW, "r")
	})
	t.Run("TwoWritersNoBarrier", func(t *testing.T) {
		s := good(t)
		cb := compute.NewCommandBuffer(b)
		if err := cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
			t.Fatal(err)
		}
		errorIs(t, cb.RMSInv(s.dy, s.r, compute.RMSInvParams(1e-5, dim), rows, dim), compute.KernelRMSInv, "r")
	})
	t.Run("BarrierMakesItValid", func(t *testing.T) {
		s := good(t)
		cb := compute.NewCommandBuffer(b)
		if err := cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
			t.Fatal(err)
		}
		cb.Barrier()
		if err := cb.DX(s.x, s.w, s.dy, s.r, s.dx, compute.DXParams(dim, 1e-5), rows, dim); err != nil {
			t.Fatalf("DX after barrier: %v", err)
		}
	})
	t.Run("CommitTwice", func(t *testing.T) {
		s := good(t)
		cb := compute.NewCommandBuffer(b)
		if err := cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim), rows, dim); err != nil {
			t.Fatal(err)
		}
		if _, err := cb.Commit(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := cb.Commit(context.Background()); !errors.Is(err, compute.ErrCommitted) {
			t.Fatalf("second Commit: %v, want ErrCommitted", err)
		}
		if err := cb.RMSInv(s.x, s.r, compute.RMSInvParams(1e-5, dim), rows, dim); !errors.Is(err, compute.ErrCommitted) {
			t.Fatalf("record after Commit: %v, want ErrCommitted", err)
		}
	})
}

// otherDType is a buffer that reports another dtype than it holds.
type otherDType struct {
	compute.Buffer
	dt compute.DType
}

func (o otherDType) DType() compute.DType { return o.dt }
