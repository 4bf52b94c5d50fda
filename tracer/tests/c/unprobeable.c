/* A library whose cuLocked starts with an instruction uprobes refuse to probe: on x86-64
 * a LOCK-prefixed one (ENOTSUPP), on arm64 an exclusive load, which cannot be stepped out
 * of line (EINVAL). While a process has the library mapped, registering a uprobe there
 * fails, and with it a uprobe_multi link that includes it. cuInit is an ordinary
 * function. */
__attribute__((visibility("default"))) int cuInit(unsigned int flags)
{
    return (int)flags;
}

#if defined(__aarch64__)
__asm__(".globl cuLocked\n"
        ".type cuLocked, %function\n"
        "cuLocked:\n"
        "    ldxr w1, [x0]\n"
        "    add w1, w1, #1\n"
        "    stxr w2, w1, [x0]\n"
        "    mov w0, #0\n"
        "    ret\n"
        ".size cuLocked, .-cuLocked\n");
#else
__asm__(".globl cuLocked\n"
        ".type cuLocked, @function\n"
        "cuLocked:\n"
        "    lock incl (%rdi)\n"
        "    xor %eax, %eax\n"
        "    ret\n"
        ".size cuLocked, .-cuLocked\n");
#endif
