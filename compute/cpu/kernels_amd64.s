//go:build amd64 && !purego

#include "textflag.h"

// AVX2 row primitives; see kernels.go for the exact arithmetic each one
// must reproduce. Separate VMULPS/VADDPS (never FMA) and the same 32 lanes
// as the Go code, so both give the same bits. Operand order is Go's:
// VSUBPS b, a, d computes d = a - b. Loops load every input before their
// first store: dx, x, dy and the dw partial rows often share their low 12
// address bits, and a load issued after a store to such an address waits
// on it (4K aliasing), which made the fused loop 3x slower in cache.

// func sumSqAVX2(x *float32, n int, acc *[32]float32)
TEXT ·sumSqAVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ acc+16(FP), DI
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	TESTQ CX, CX
	JZ sumsq_done
sumsq_loop:
	VMOVUPS 0(SI), Y4
	VMULPS Y4, Y4, Y4
	VADDPS Y4, Y0, Y0
	VMOVUPS 32(SI), Y5
	VMULPS Y5, Y5, Y5
	VADDPS Y5, Y1, Y1
	VMOVUPS 64(SI), Y6
	VMULPS Y6, Y6, Y6
	VADDPS Y6, Y2, Y2
	VMOVUPS 96(SI), Y7
	VMULPS Y7, Y7, Y7
	VADDPS Y7, Y3, Y3
	ADDQ $128, SI
	SUBQ $32, CX
	JNZ sumsq_loop
sumsq_done:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VZEROUPPER
	RET

// func dotAVX2(x, dy, w *float32, n int, ss, s *[32]float32)
TEXT ·dotAVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), SI
	MOVQ dy+8(FP), DX
	MOVQ w+16(FP), BX
	MOVQ n+24(FP), CX
	MOVQ ss+32(FP), DI
	MOVQ s+40(FP), R8
	VMOVUPS 0(DI), Y0
	VMOVUPS 32(DI), Y1
	VMOVUPS 64(DI), Y2
	VMOVUPS 96(DI), Y3
	VMOVUPS 0(R8), Y4
	VMOVUPS 32(R8), Y5
	VMOVUPS 64(R8), Y6
	VMOVUPS 96(R8), Y7
	TESTQ CX, CX
	JZ dot_done
dot_loop:
	VMOVUPS 0(SI), Y8
	VMOVUPS 0(DX), Y9
	VMULPS Y8, Y8, Y10
	VADDPS Y10, Y0, Y0
	VMULPS 0(BX), Y9, Y11
	VMULPS Y8, Y11, Y11
	VADDPS Y11, Y4, Y4
	VMOVUPS 32(SI), Y8
	VMOVUPS 32(DX), Y9
	VMULPS Y8, Y8, Y10
	VADDPS Y10, Y1, Y1
	VMULPS 32(BX), Y9, Y11
	VMULPS Y8, Y11, Y11
	VADDPS Y11, Y5, Y5
	VMOVUPS 64(SI), Y8
	VMOVUPS 64(DX), Y9
	VMULPS Y8, Y8, Y10
	VADDPS Y10, Y2, Y2
	VMULPS 64(BX), Y9, Y11
	VMULPS Y8, Y11, Y11
	VADDPS Y11, Y6, Y6
	VMOVUPS 96(SI), Y8
	VMOVUPS 96(DX), Y9
	VMULPS Y8, Y8, Y10
	VADDPS Y10, Y3, Y3
	VMULPS 96(BX), Y9, Y11
	VMULPS Y8, Y11, Y11
	VADDPS Y11, Y7, Y7
	ADDQ $128, SI
	ADDQ $128, DX
	ADDQ $128, BX
	SUBQ $32, CX
	JNZ dot_loop
dot_done:
	VMOVUPS Y0, 0(DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVUPS Y4, 0(R8)
	VMOVUPS Y5, 32(R8)
	VMOVUPS Y6, 64(R8)
	VMOVUPS Y7, 96(R8)
	VZEROUPPER
	RET

// func dxAVX2(x, dy, w, dx *float32, n int, r, c float32, nt bool)
TEXT ·dxAVX2(SB), NOSPLIT, $0-49
	MOVQ x+0(FP), SI
	MOVQ dy+8(FP), DX
	MOVQ w+16(FP), BX
	MOVQ dx+24(FP), DI
	MOVQ n+32(FP), CX
	VBROADCASTSS r+40(FP), Y14
	VBROADCASTSS c+44(FP), Y15
	MOVBLZX nt+48(FP), AX
	TESTQ CX, CX
	JZ dxavx2_done
	TESTQ AX, AX
	JNZ dxavx2_nt
dxavx2_loop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 0(DX), Y1
	VMULPS 0(BX), Y1, Y2
	VMULPS Y15, Y0, Y3
	VSUBPS Y3, Y2, Y2
	VMULPS Y14, Y2, Y2
	VMOVUPS Y2, 0(DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, BX
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ dxavx2_loop
	JMP dxavx2_done
dxavx2_nt:
dxavx2_ntloop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 0(DX), Y1
	VMULPS 0(BX), Y1, Y2
	VMULPS Y15, Y0, Y3
	VSUBPS Y3, Y2, Y2
	VMULPS Y14, Y2, Y2
	VMOVNTPS Y2, 0(DI)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, BX
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ dxavx2_ntloop
	SFENCE
dxavx2_done:
	VZEROUPPER
	RET

// func dxdwAVX2(x, dy, w, dx, p *float32, n int, r, c float32, nt bool)
TEXT ·dxdwAVX2(SB), NOSPLIT, $0-57
	MOVQ x+0(FP), SI
	MOVQ dy+8(FP), DX
	MOVQ w+16(FP), BX
	MOVQ dx+24(FP), DI
	MOVQ p+32(FP), R8
	MOVQ n+40(FP), CX
	VBROADCASTSS r+48(FP), Y14
	VBROADCASTSS c+52(FP), Y15
	MOVBLZX nt+56(FP), AX
	TESTQ CX, CX
	JZ dxdwavx2_done
	TESTQ AX, AX
	JNZ dxdwavx2_nt
dxdwavx2_loop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 0(DX), Y1
	VMOVUPS 0(R8), Y5
	VMULPS 0(BX), Y1, Y2
	VMULPS Y15, Y0, Y3
	VSUBPS Y3, Y2, Y2
	VMULPS Y14, Y2, Y2
	VMULPS Y0, Y1, Y4
	VMULPS Y14, Y4, Y4
	VADDPS Y5, Y4, Y4
	VMOVUPS Y4, 0(R8)
	VMOVUPS Y2, 0(DI)
	ADDQ $32, R8
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, BX
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ dxdwavx2_loop
	JMP dxdwavx2_done
dxdwavx2_nt:
dxdwavx2_ntloop:
	VMOVUPS 0(SI), Y0
	VMOVUPS 0(DX), Y1
	VMOVUPS 0(R8), Y5
	VMULPS 0(BX), Y1, Y2
	VMULPS Y15, Y0, Y3
	VSUBPS Y3, Y2, Y2
	VMULPS Y14, Y2, Y2
	VMULPS Y0, Y1, Y4
	VMULPS Y14, Y4, Y4
	VADDPS Y5, Y4, Y4
	VMOVUPS Y4, 0(R8)
	VMOVNTPS Y2, 0(DI)
	ADDQ $32, R8
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, BX
	ADDQ $32, DI
	SUBQ $8, CX
	JNZ dxdwavx2_ntloop
	SFENCE
dxdwavx2_done:
	VZEROUPPER
	RET

// func dwAVX2(x, dy, p *float32, n int, r float32)
TEXT ·dwAVX2(SB), NOSPLIT, $0-36
	MOVQ x+0(FP), SI
	MOVQ dy+8(FP), DX
	MOVQ p+16(FP), R8
	MOVQ n+24(FP), CX
	VBROADCASTSS r+32(FP), Y14
	TESTQ CX, CX
	JZ dw_done
dw_loop:
	VMOVUPS 0(SI), Y0
	VMULPS 0(DX), Y0, Y4
	VMULPS Y14, Y4, Y4
	VADDPS 0(R8), Y4, Y4
	VMOVUPS Y4, 0(R8)
	ADDQ $32, SI
	ADDQ $32, DX
	ADDQ $32, R8
	SUBQ $8, CX
	JNZ dw_loop
dw_done:
	VZEROUPPER
	RET
