/* A library whose cuLocked starts with a LOCK-prefixed instruction, which x86 uprobes
 * refuse to probe: while a process has the library mapped, registering a uprobe there
 * fails (ENOTSUPP), and with it a uprobe_multi link that includes it. cuInit is an
 * ordinary function. */
__attribute__((visibility("default"))) int cuInit(unsigned int flags)
{
    return (int)flags;
}

__asm__(".globl cuLocked\n"
        ".type cuLocked, @function\n"
        "cuLocked:\n"
        "    lock incl (%rdi)\n"
        "    xor %eax, %eax\n"
        "    ret\n"
        ".size cuLocked, .-cuLocked\n");
