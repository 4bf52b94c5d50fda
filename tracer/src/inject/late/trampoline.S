# The trampoline that a running program runs to load cudatrace's injection library
# (tracer/src/inject/late/trampoline.rs holds these bytes; its test assembles this file
# with `as --64` and compares). r15 points at the data block cudatrace wrote on the
# thread's stack: the saved registers, dlopen, dlsym, the names and the settings.
        .intel_syntax noprefix
        .text
        .globl tramp
tramp:
        mov eax, 0xd
        xor ecx, ecx
        cpuid
        mov r12, rsp
        sub rsp, rbx
        and rsp, -64
        mov r13, rsp
        xor eax, eax
        mov [rsp+512], rax
        mov [rsp+520], rax
        mov [rsp+528], rax
        mov [rsp+536], rax
        mov [rsp+544], rax
        mov [rsp+552], rax
        mov [rsp+560], rax
        mov [rsp+568], rax
        mov eax, -1
        mov edx, -1
        xsave64 [r13]
        lea rdi, [r15+0x100]
        mov esi, 2
        call [r15+0xe0]
        test rax, rax
        jz 1f
        mov rdi, rax
        lea rsi, [r15+0xc0]
        call [r15+0xe8]
        test rax, rax
        jz 1f
        lea rdi, [r15+0x200]
        call rax
1:
        mov eax, -1
        mov edx, -1
        xrstor64 [r13]
        mov rsp, r12
        push qword ptr [r15+0x90]
        popfq
        mov rax, [r15+0x00]
        mov rbx, [r15+0x08]
        mov rcx, [r15+0x10]
        mov rdx, [r15+0x18]
        mov rsi, [r15+0x20]
        mov rdi, [r15+0x28]
        mov rbp, [r15+0x30]
        mov r8,  [r15+0x38]
        mov r9,  [r15+0x40]
        mov r10, [r15+0x48]
        mov r11, [r15+0x50]
        mov r12, [r15+0x58]
        mov r13, [r15+0x60]
        mov r14, [r15+0x68]
        mov rsp, [r15+0x80]
        mov r15, [rip+saved_r15]
        jmp [rip+saved_rip]
        .balign 8
saved_r15: .quad 0
saved_rip: .quad 0
