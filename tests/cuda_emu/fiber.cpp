// The fibers' context switch (cuda_emu.hpp), x86-64 System V: push the callee-saved registers,
// swap stack pointers, pop the other fiber's and return on its stack.
#include "cuda_emu.hpp"

#if !TANDEM_EMU_UCONTEXT
asm(R"(
    .text
    .globl tandem_emu_switch
    .type tandem_emu_switch, @function
tandem_emu_switch:
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
    .size tandem_emu_switch, .-tandem_emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#endif
