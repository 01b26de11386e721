// fiber_switch.h: the switch between fibers (user-space contexts, each with
// its own stack) of the CPU runners of the GPU kernels: the Metal shader's
// driver (driver.cpp here) and the CUDA kernels' emulator
// (cuda/testdata/emu_shim.h, which includes this file by its path).
//
// On x86-64 ELF hosts (Linux, the BSDs) a switch saves the System V
// callee-saved registers and the stack pointer and loads another
// context's, a few instructions; the fibers share the floating-point
// environment. Elsewhere, or with FIBER_UCONTEXT defined, ucontext, whose
// swapcontext also sets the signal mask: a system call per switch, which
// took most of the runners' time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__) && defined(__ELF__) && !defined(FIBER_UCONTEXT)
#define FIBER_ASM_SWITCH 1
// A weak symbol: every translation unit that includes this header
// defines it, and the linker keeps one.
extern "C" void fiber_switch_x86_64(void** save, void* load);
asm(R"(
    .text
    .weak fiber_switch_x86_64
    .type fiber_switch_x86_64, @function
fiber_switch_x86_64:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size fiber_switch_x86_64, .-fiber_switch_x86_64
)");
struct FiberCtx {
    void* sp = nullptr;
};
#else
#define FIBER_ASM_SWITCH 0
#include <ucontext.h>
struct FiberCtx {
    ucontext_t uc;
};
#endif

// fiber_switch saves the running context in from and resumes to.
inline void fiber_switch(FiberCtx& from, FiberCtx& to) {
#if FIBER_ASM_SWITCH
    fiber_switch_x86_64(&from.sp, to.sp);
#else
    if (swapcontext(&from.uc, &to.uc) != 0) {
        std::perror("fiber: swapcontext");
        std::abort();
    }
#endif
}

// fiber_init makes c start entry on the stack [stack, stack+size) at its
// first fiber_switch. entry must never return: it ends by switching away
// for good.
inline void fiber_init(FiberCtx& c, char* stack, size_t size, void (*entry)()) {
#if FIBER_ASM_SWITCH
    // The frame the switch pops: six registers, then the return address,
    // at a 16-byte boundary so that entry is entered as if called.
    const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t(15);
    void** a = reinterpret_cast<void**>(top - 16);
    a[1] = nullptr;
    a[0] = reinterpret_cast<void*>(entry);
    for (int i = 1; i <= 6; i++) a[-i] = nullptr;
    c.sp = a - 6;
#else
    if (getcontext(&c.uc) != 0) {
        std::perror("fiber: getcontext");
        std::abort();
    }
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
#endif
}
