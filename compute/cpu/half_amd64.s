//go:build amd64 && !purego

#include "textflag.h"

// Conversions between float32 and the half dtypes; see kernels.go and
// compute/half for the bits each must reproduce. n is a multiple of 16 and
// > 0 in every function.

DATA halfExpMask<>+0(SB)/4, $0x7f800000
GLOBL halfExpMask<>(SB), RODATA|NOPTR, $4
DATA halfMantMask<>+0(SB)/4, $0x007fffff
GLOBL halfMantMask<>(SB), RODATA|NOPTR, $4
DATA halfAbsMask<>+0(SB)/4, $0x7fffffff
GLOBL halfAbsMask<>(SB), RODATA|NOPTR, $4
DATA halfOne<>+0(SB)/4, $1
GLOBL halfOne<>(SB), RODATA|NOPTR, $4
DATA halfBias<>+0(SB)/4, $0x7fff
GLOBL halfBias<>(SB), RODATA|NOPTR, $4
DATA halfQuiet<>+0(SB)/4, $0x40
GLOBL halfQuiet<>(SB), RODATA|NOPTR, $4

// func bf16ToF32AVX2(dst *float32, src *uint16, n int)
// A bfloat16 is the top half of its float32: zero-extend and shift.
TEXT ·bf16ToF32AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
bf16w_loop:
	VPMOVZXWD 0(SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPSLLD $16, Y0, Y0
	VPSLLD $16, Y1, Y1
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ bf16w_loop
	VZEROUPPER
	RET

// func f16ToF32F16C(dst *float32, src *uint16, n int)
// F16C VCVTPH2PS: exact, a signalling NaN quieted.
TEXT ·f16ToF32F16C(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
f16w_loop:
	VCVTPH2PS 0(SI), Y0
	VCVTPH2PS 16(SI), Y1
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	ADDQ $32, SI
	ADDQ $64, DI
	SUBQ $16, CX
	JNZ f16w_loop
	VZEROUPPER
	RET

// func f32ToF16F16C(dst *uint16, src *float32, n int)
// F16C VCVTPS2PH with immediate 0: round to nearest even (not MXCSR's
// mode), subnormal results kept, overflow to Inf, NaN quieted.
TEXT ·f32ToF16F16C(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
f16n_loop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 32(SI), Y1
	VCVTPS2PH $0, Y0, X2
	VCVTPS2PH $0, Y1, X3
	VMOVDQU X2, 0(DI)
	VMOVDQU X3, 16(DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JNZ f16n_loop
	VZEROUPPER
	RET

// func f32ToBF16AVX512(dst *uint16, src *float32, n int)
// AVX-512 BF16 VCVTNEPS2BF16 rounds to nearest even and quiets a NaN as
// compute/half does, but treats a subnormal input as zero (DAZ): lanes
// with a zero exponent and a non-zero mantissa are redone with the
// integer rounding (x + 0x7fff + lsb) >> 16 and merged in by mask.
// The Go assembler lacks VCVTNEPS2BF16: it is encoded as bytes,
// EVEX.512.F3.0F38.W0 72 /r with ModRM 0xc8 (ymm1 <- zmm0).
TEXT ·f32ToBF16AVX512(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VPBROADCASTD halfExpMask<>(SB), Z2
	VPBROADCASTD halfMantMask<>(SB), Z3
	VPBROADCASTD halfOne<>(SB), Z5
	VPBROADCASTD halfBias<>(SB), Z6
bf16n_loop:
	VMOVUPS 0(SI), Z0
	// VCVTNEPS2BF16 Z0, Y1
	BYTE $0x62; BYTE $0xf2; BYTE $0x7e; BYTE $0x48; BYTE $0x72; BYTE $0xc8
	VPTESTNMD Z2, Z0, K1
	VPTESTMD Z3, Z0, K1, K2
	KORTESTW K2, K2
	JZ bf16n_store
	VPSRLD $16, Z0, Z4
	VPANDD Z5, Z4, Z4
	VPADDD Z6, Z0, Z7
	VPADDD Z4, Z7, Z7
	VPSRLD $16, Z7, Z7
	VPMOVDW Z7, Y8
	VMOVDQU16 Y8, K2, Y1
bf16n_store:
	VMOVDQU Y1, 0(DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JNZ bf16n_loop
	VZEROUPPER
	RET

// func f32ToBF16AVX2(dst *uint16, src *float32, n int)
// Without AVX-512 BF16: (x + 0x7fff + lsb) >> 16 for every lane, and
// (x >> 16) | 0x40 for NaN lanes, packed to words.
TEXT ·f32ToBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VPBROADCASTD halfOne<>(SB), Y5
	VPBROADCASTD halfBias<>(SB), Y6
	VPBROADCASTD halfAbsMask<>(SB), Y7
	VPBROADCASTD halfExpMask<>(SB), Y8
	VPBROADCASTD halfQuiet<>(SB), Y9
bf16a_loop:
	VMOVDQU 0(SI), Y0
	VPSRLD $16, Y0, Y1
	VPAND Y5, Y1, Y1
	VPADDD Y6, Y0, Y2
	VPADDD Y1, Y2, Y2
	VPSRLD $16, Y2, Y2
	VPAND Y7, Y0, Y3
	VPCMPGTD Y8, Y3, Y3
	VPSRLD $16, Y0, Y4
	VPOR Y9, Y4, Y4
	VPBLENDVB Y3, Y4, Y2, Y2
	VMOVDQU 32(SI), Y0
	VPSRLD $16, Y0, Y1
	VPAND Y5, Y1, Y1
	VPADDD Y6, Y0, Y10
	VPADDD Y1, Y10, Y10
	VPSRLD $16, Y10, Y10
	VPAND Y7, Y0, Y3
	VPCMPGTD Y8, Y3, Y3
	VPSRLD $16, Y0, Y4
	VPOR Y9, Y4, Y4
	VPBLENDVB Y3, Y4, Y10, Y10
	VPACKUSDW Y10, Y2, Y2
	VPERMQ $0xD8, Y2, Y2
	VMOVDQU Y2, 0(DI)
	ADDQ $64, SI
	ADDQ $32, DI
	SUBQ $16, CX
	JNZ bf16a_loop
	VZEROUPPER
	RET
