package jobs

import "context"

// TensorInfo is one input tensor's header: what the handler checks before any
// data moves. Handle carries the store's own description of the tensor
// (storage.TensorInfo for the storage.Router adapter) back to Fetch.
type TensorInfo struct {
	URI   string
	DType string
	Shape []int
	Size  int64 // data bytes
	// Local is true when Fetch needs no I/O: the header read already
	// holds the data (a small object), so Fetch is a copy.
	Local  bool
	Handle any
}

// OutTensor is one tensor of the output object, its bytes borrowed from a
// compute buffer.
type OutTensor struct {
	Name  string
	DType string
	Shape []int
	Data  []byte
	// SHA256 is the sha256 of Data when the batcher already hashed it
	// (nil otherwise); a Store that records digests may use it as is.
	SHA256 *[32]byte
}

// Store is what the handler needs from storage. storage.Router provides it
// (through the worker's adapter); tests use fakes. Errors wrap the storage
// sentinels so storage.Permanent classifies them.
type Store interface {
	// Check enforces the allow-list for reading (write=false) or writing
	// uri, without I/O.
	Check(uri string, write bool) error
	// Head reads the tensor's header only.
	Head(ctx context.Context, uri string) (TensorInfo, error)
	// Fetch fills dst (exactly t.Size bytes) with the tensor's data.
	Fetch(ctx context.Context, t TensorInfo, dst []byte) error
	// Write stores the tensors as one safetensors object at uri,
	// atomically, and returns the hex sha256 of each tensor's bytes and the
	// object's size.
	Write(ctx context.Context, uri string, outs []OutTensor, meta map[string]string) (sha256 map[string]string, bytes int64, err error)
	// Ping reports whether the stores are reachable (for /readyz).
	Ping(ctx context.Context) error
}

// InlineTaker is a Store that can hand over the bytes of a Local tensor
// instead of copying them in Fetch (storage.TensorInfo.TakeInline). The
// handler uses it when the backend is a compute.HostAdopter.
type InlineTaker interface {
	// TakeInline returns t's bytes and a func that gives their memory back
	// (called once, when they are no longer used); ok is false when t's
	// bytes are not held or were taken already, and Fetch reads them then.
	TakeInline(t TensorInfo) (data []byte, release func(), ok bool)
}
