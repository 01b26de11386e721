//go:build amd64 && !purego

#include "textflag.h"

DATA finiteExp<>+0(SB)/4, $0x7f800000
GLOBL finiteExp<>(SB), RODATA|NOPTR, $4
DATA finiteOne<>+0(SB)/4, $0x00800000
GLOBL finiteOne<>(SB), RODATA|NOPTR, $4

// func finiteAVX2(p *float32, blocks int) bool
//
// For each 32-bit lane: (bits & 0x7f800000) + 0x00800000 sets bit 31
// exactly when the exponent is all ones (Inf or NaN). The sums are OR-ed
// into four accumulators (independent chains); VMOVMSKPS gathers their
// bit 31s at the end.
TEXT ·finiteAVX2(SB), NOSPLIT, $0-17
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	VPBROADCASTD finiteExp<>(SB), Y0
	VPBROADCASTD finiteOne<>(SB), Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	VPXOR Y4, Y4, Y4
	VPXOR Y5, Y5, Y5

loop:
	VPAND   (SI), Y0, Y6
	VPADDD  Y1, Y6, Y6
	VPOR    Y6, Y2, Y2
	VPAND   32(SI), Y0, Y7
	VPADDD  Y1, Y7, Y7
	VPOR    Y7, Y3, Y3
	VPAND   64(SI), Y0, Y8
	VPADDD  Y1, Y8, Y8
	VPOR    Y8, Y4, Y4
	VPAND   96(SI), Y0, Y9
	VPADDD  Y1, Y9, Y9
	VPOR    Y9, Y5, Y5
	ADDQ    $128, SI
	DECQ    CX
	JNZ     loop

	VPOR      Y3, Y2, Y2
	VPOR      Y5, Y4, Y4
	VPOR      Y4, Y2, Y2
	VMOVMSKPS Y2, AX
	VZEROUPPER
	TESTL     AX, AX
	SETEQ     ret+16(FP)
	RET

// func finite16AVX2(p *uint16, blocks int, exp, one uint16) bool
//
// finiteAVX2 on 16-bit lanes: (bits & exp) + one sets bit 15 exactly when
// a half value's exponent is all ones. VPMOVMSKB gathers every byte's top
// bit; the odd bytes' are the lanes' bit 15.
TEXT ·finite16AVX2(SB), NOSPLIT, $0-25
	MOVQ p+0(FP), SI
	MOVQ blocks+8(FP), CX
	VPBROADCASTW exp+16(FP), Y0
	VPBROADCASTW one+18(FP), Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	VPXOR Y4, Y4, Y4
	VPXOR Y5, Y5, Y5

loop16:
	VPAND   (SI), Y0, Y6
	VPADDW  Y1, Y6, Y6
	VPOR    Y6, Y2, Y2
	VPAND   32(SI), Y0, Y7
	VPADDW  Y1, Y7, Y7
	VPOR    Y7, Y3, Y3
	VPAND   64(SI), Y0, Y8
	VPADDW  Y1, Y8, Y8
	VPOR    Y8, Y4, Y4
	VPAND   96(SI), Y0, Y9
	VPADDW  Y1, Y9, Y9
	VPOR    Y9, Y5, Y5
	ADDQ    $128, SI
	DECQ    CX
	JNZ     loop16

	VPOR      Y3, Y2, Y2
	VPOR      Y5, Y4, Y4
	VPOR      Y4, Y2, Y2
	VPMOVMSKB Y2, AX
	VZEROUPPER
	ANDL      $0xaaaaaaaa, AX
	SETEQ     ret+24(FP)
	RET
