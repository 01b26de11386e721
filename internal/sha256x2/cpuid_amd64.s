//go:build amd64 && !purego

#include "textflag.h"

// func hasSHA() bool
TEXT ·hasSHA(SB), NOSPLIT, $0-1
	MOVL $0, AX
	CPUID
	CMPL AX, $7
	JB   no
	MOVL $7, AX
	MOVL $0, CX
	CPUID
	SHRL $29, BX
	ANDL $1, BX
	MOVB BX, ret+0(FP)
	RET
no:
	MOVB $0, ret+0(FP)
	RET
