// Package storage names tensors by URI, routes each URI to the Store of its
// scheme, enforces the allow-list, and moves tensor bytes between stores and
// caller-owned buffers (the compute backend's memory) without intermediate
// copies. The tensor format is safetensors (see storage/safetensors).
//
// Concrete stores live in their own packages, named after what they wrap:
// storage/file (local disk) and storage/s3 (minio-go). The worker wires them
// into a Router:
//
//	r := storage.NewRouter()
//	r.Register("file", fileStore)
//	r.Register("s3", s3Store)
//	x, err := r.Head(ctx, "s3://bucket/in.safetensors#x") // header only
//	err = r.Fetch(ctx, x, buf)                              // one range read into buf
//	res, err := r.Write(ctx, "s3://bucket/out.safetensors", outs, meta)
//
// Every error a caller sees is an *Error naming the operation, the URI and
// the tensor, wrapping one of the sentinels below with the limit that was
// broken; Permanent says whether a retry could help.
package storage
