package compute

// Buffer is device-visible memory holding a tensor. For the CPU and Metal
// (unified memory) backends the host view is the device memory itself; for
// CUDA it is pinned host memory that Execute copies to and from the device.
//
// Storage reads land directly in Bytes() and writes stream from it, so tensor
// data is never copied through an intermediate buffer.
type Buffer interface {
	// DType is the element type.
	DType() DType
	// Shape is the logical shape; its product is Len.
	Shape() []int
	// Len is the number of elements.
	Len() int
	// Bytes is the host view of the whole buffer (Len*DType.Size bytes).
	Bytes() []byte
	// Float32s is the host view as f32; nil unless DType is F32.
	Float32s() []float32
	// Release returns the buffer to its backend's pool. The buffer must not
	// be used afterwards, nor while a command buffer that uses it runs.
	Release()
}

// NumElements returns the product of shape, or -1 if any dimension is
// negative or the product overflows int.
func NumElements(shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return -1
		}
		if d != 0 && n > maxInt/d {
			return -1
		}
		n *= d
	}
	return n
}

const maxInt = int(^uint(0) >> 1)
