// Package safetensors is the strict codec for the safetensors format (the
// tensor files of Hugging Face, PyTorch, JAX and MLX): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype,
// shape and data_offsets plus an optional string-to-string __metadata__, then
// the tensors' bytes.
//
// Reading is strict because headers come from job submitters: the header
// length is capped (MaxHeaderSize, the reference implementation's 100 MB),
// the JSON must be valid UTF-8 with no duplicate names or fields and no
// unknown fields, every shape product and byte count must fit in an int64,
// each tensor's bytes must be exactly prod(shape)*sizeof(dtype) long, and
// the tensors must tile the data section exactly (no gaps, no overlaps, no
// trailing bytes), which pins the object's real size. The parser reads only
// the header; callers range-read the tensor they need (Entry.Begin/End are
// relative to Header.DataStart).
//
// The encoder writes tensors in the order given, the metadata first, and
// pads the header with spaces so the data starts 8-byte aligned, as the
// reference writer does.
package safetensors
