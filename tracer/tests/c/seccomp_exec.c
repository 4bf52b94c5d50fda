/*
 * seccomp_exec.c -- runs a program under a seccomp filter (one that allows every system
 * call: what matters to cudatrace is that a filter is there), for the test that
 * `cudatrace run -p PID --gpu` refuses such a process and leaves it untouched.
 *
 *   seccomp_exec PROGRAM [ARGS...]
 */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: seccomp_exec PROGRAM [ARGS...]\n");
        return 2;
    }
    struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    struct sock_fprog program = {.len = 1, .filter = &allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)) {
        perror("seccomp_exec: prctl");
        return 3;
    }
    execv(argv[1], argv + 1);
    perror("seccomp_exec: execv");
    return 4;
}
