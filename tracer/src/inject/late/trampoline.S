# The trampoline that a running program runs to load cudatrace's injection library
# (tracer/src/inject/late/trampoline.rs holds these bytes; its test assembles this file
# with `as --64` and compares). r15 points at the data block cudatrace wrote on the
# thread's stack: the saved registers, dlopen, dlsym, the names; the settings and the
# library's path come later, with the word that says go.
#
# It makes two anonymous files (memfd_create: the library's, the control file's), moves
# the library's to the lowest free descriptor at or above the floor cudatrace gave
# (fcntl F_DUPFD_CLOEXEC; where that fails it stays where it is), and puts their numbers
# in the block; cudatrace takes copies of them (pidfd_getfd), then says go (1: the library
# is written, load it from /proc/self/fd/N and start it; or call cudatrace_attach where it
# is loaded already) or give up (2). Once dlopen returned the library, its descriptor is
# never closed: the loader knows the library by that path (link_map's l_name, what dladdr
# answers), and the path must go on naming it for as long as it is loaded. After the call
# it puts the result in the block and waits for cudatrace to see the library's thread map
# the control file (3). Each wait yields (sched_yield) until 8e9 time-stamp-counter ticks
# went by (2 s or more below 4 GHz): no sleeping system call, which an interruption (a
# stop of the whole process by cudatrace's discovery, a signal) would leave with a
# restart of its own, in place of the restart of the call the thread was stopped in. A
# dead cudatrace never says: the thread goes on after the wait. Either way the control
# file's descriptor is closed (the library's mapping keeps the file), and the library's
# where it was not loaded.
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
        mov eax, 319
        lea rdi, [r15+0x180]
        mov esi, 3
        syscall
        mov [r15+0x98], rax
        test rax, rax
        js 7f
        mov rdi, rax
        mov eax, 72
        mov esi, 1030
        mov rdx, [r15+0xb0]
        syscall
        test rax, rax
        js 7f
        xchg rax, [r15+0x98]
        mov rdi, rax
        mov eax, 3
        syscall
7:
        mov eax, 319
        lea rdi, [r15+0x1c0]
        mov esi, 3
        syscall
        mov [r15+0xa0], rax
        rdtsc
        shl rdx, 32
        or rax, rdx
        mov rbx, 8000000000
        add rbx, rax
2:
        mov eax, [r15+0xa8]
        cmp eax, 1
        je 3f
        cmp eax, 2
        je 4f
        mov eax, 24
        syscall
        rdtsc
        shl rdx, 32
        or rax, rdx
        cmp rax, rbx
        jb 2b
        jmp 4f
3:
        mov rax, [r15+0xf0]
        test rax, rax
        jnz 5f
        lea rdi, [r15+0x100]
        mov esi, 2
        call [r15+0xe0]
        mov rcx, -1
        test rax, rax
        jz 9f
        mov qword ptr [r15+0x98], -1
        mov rdi, rax
        lea rsi, [r15+0xc0]
        call [r15+0xe8]
        mov rcx, -2
        test rax, rax
        jz 9f
5:
        lea rdi, [r15+0x200]
        call rax
        movsxd rcx, eax
9:
        mov [r15+0xf8], rcx
        rdtsc
        shl rdx, 32
        or rax, rdx
        mov rbx, 8000000000
        add rbx, rax
8:
        mov eax, [r15+0xa8]
        cmp eax, 3
        je 4f
        mov eax, 24
        syscall
        rdtsc
        shl rdx, 32
        or rax, rdx
        cmp rax, rbx
        jb 8b
4:
        mov rdi, [r15+0x98]
        test rdi, rdi
        js 6f
        mov eax, 3
        syscall
6:
        mov rdi, [r15+0xa0]
        test rdi, rdi
        js 1f
        mov eax, 3
        syscall
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
