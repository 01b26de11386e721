package half

import "encoding/binary"

// DecodeBF16 sets dst[i] to the i-th little-endian bfloat16 of src;
// len(src) must be 2*len(dst).
func DecodeBF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = BF16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// EncodeBF16 writes each v[i], rounded to bfloat16, as 2 little-endian
// bytes at dst[2*i:]; len(dst) must be 2*len(v).
func EncodeBF16(dst []byte, v []float32) {
	dst = dst[:2*len(v)]
	for i, f := range v {
		binary.LittleEndian.PutUint16(dst[2*i:], Float32ToBF16(f))
	}
}

// DecodeF16 sets dst[i] to the i-th little-endian binary16 of src;
// len(src) must be 2*len(dst).
func DecodeF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = F16ToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

// EncodeF16 writes each v[i], rounded to binary16, as 2 little-endian bytes
// at dst[2*i:]; len(dst) must be 2*len(v).
func EncodeF16(dst []byte, v []float32) {
	dst = dst[:2*len(v)]
	for i, f := range v {
		binary.LittleEndian.PutUint16(dst[2*i:], Float32ToF16(f))
	}
}
