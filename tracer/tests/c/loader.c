/*
 * loader.c -- test program for library discovery, built as `loader` by the root tests.
 * It is NOT linked against libcuda: it dlopen()s the stand-in libcuda (standin/) from
 * the path given, as Python wheels and containers load theirs, and calls into it at
 * once. Each mode makes a fixed list of calls; unexpected results exit 3, bad usage 2.
 *
 *   loader PATH calls N      dlopen(PATH); cuInit(0); N x cuCtxSynchronize(); prints "N\n"
 *   loader PATH reopen K     K x { dlopen(PATH); cuInit(0); dlclose() }; prints "K\n"
 *   loader PATH fork         dlopen(PATH); cuInit(0); fork();
 *                              child: cuMemAlloc_v2(&p, 12345) at once; _exit(0)
 *                              parent: waits; cuMemAlloc_v2(&p, 54321)
 *   loader PATH longjmp N    dlopen(PATH); N x { cuDeviceGet((CUdevice *)8, 0): the stand-in
 *                            writes to address 8, SIGSEGV, and the handler siglongjmp()s out:
 *                            the call never returns }; then 6 x cuMemAlloc_v2(&p, 1000 + i)
 *                            (i = 0..5); prints "N\n"
 *   loader PATH stop-here    waits for SIGUSR1; dlopen(PATH); prints "opened\n"; cuInit(0);
 *                            waits for SIGUSR1 again; cuMemAlloc_v2(&p, 4242) (the waits are
 *                            sigsuspend, race-free; "ready\n" is printed before the first)
 *   loader PATH pause SECS   dlopen(PATH); cuInit(0); sleeps SECS; cuMemAlloc_v2(&p, 777)
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int (*init_fn)(unsigned int);
typedef int (*sync_fn)(void);
typedef int (*alloc_fn)(unsigned long long *, size_t);
typedef int (*device_get_fn)(int *, int);

static void *open_library(const char *path)
{
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "loader: dlopen %s: %s\n", path, dlerror());
        exit(3);
    }
    return library;
}

static void *symbol(void *library, const char *name)
{
    void *address = dlsym(library, name);
    if (address == NULL) {
        fprintf(stderr, "loader: dlsym %s: %s\n", name, dlerror());
        exit(3);
    }
    return address;
}

static void expect(const char *what, int got, int want)
{
    if (got != want) {
        fprintf(stderr, "loader: %s returned %d, expected %d\n", what, got, want);
        exit(3);
    }
}

static sigjmp_buf g_escape;
static volatile sig_atomic_t g_usr1;

static void on_segv(int sig)
{
    (void)sig;
    siglongjmp(g_escape, 1);
}

static void on_usr1(int sig)
{
    (void)sig;
    g_usr1 = 1;
}

/* One call that never returns: called from the same place each time, so each abandoned
 * call is entered with the same stack pointer and return address. */
static __attribute__((noinline)) void leak_once(device_get_fn device_get)
{
    if (sigsetjmp(g_escape, 1) == 0) {
        device_get((int *)8, 0);
        fprintf(stderr, "loader: cuDeviceGet((CUdevice *)8) returned\n");
        exit(3);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: loader PATH calls N | reopen K | fork | longjmp N | "
                        "stop-here | pause SECS\n");
        return 2;
    }
    const char *path = argv[1];
    const char *mode = argv[2];
    long n = argc > 3 ? strtol(argv[3], NULL, 10) : 0;

    if (strcmp(mode, "calls") == 0) {
        void *library = open_library(path);
        expect("cuInit", ((init_fn)symbol(library, "cuInit"))(0), 0);
        sync_fn sync = (sync_fn)symbol(library, "cuCtxSynchronize");
        for (long i = 0; i < n; i++)
            expect("cuCtxSynchronize", sync(), 0);
        printf("%ld\n", n);
        return 0;
    }
    if (strcmp(mode, "reopen") == 0) {
        for (long i = 0; i < n; i++) {
            void *library = open_library(path);
            expect("cuInit", ((init_fn)symbol(library, "cuInit"))(0), 0);
            dlclose(library);
        }
        printf("%ld\n", n);
        return 0;
    }
    if (strcmp(mode, "fork") == 0) {
        void *library = open_library(path);
        expect("cuInit", ((init_fn)symbol(library, "cuInit"))(0), 0);
        alloc_fn alloc = (alloc_fn)symbol(library, "cuMemAlloc_v2");
        unsigned long long pointer = 0;
        pid_t child = fork();
        if (child == 0) {
            expect("cuMemAlloc_v2", alloc(&pointer, 12345), 0);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        expect("cuMemAlloc_v2", alloc(&pointer, 54321), 0);
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
    }
    if (strcmp(mode, "longjmp") == 0) {
        void *library = open_library(path);
        device_get_fn device_get = (device_get_fn)symbol(library, "cuDeviceGet");
        alloc_fn alloc = (alloc_fn)symbol(library, "cuMemAlloc_v2");
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = on_segv;
        action.sa_flags = SA_NODEFER;
        sigaction(SIGSEGV, &action, NULL);
        for (long i = 0; i < n; i++)
            leak_once(device_get);
        unsigned long long pointer = 0;
        for (int i = 0; i < 6; i++)
            expect("cuMemAlloc_v2", alloc(&pointer, 1000 + i), 0);
        printf("%ld\n", n);
        return 0;
    }
    if (strcmp(mode, "stop-here") == 0) {
        sigset_t usr1, old;
        sigemptyset(&usr1);
        sigaddset(&usr1, SIGUSR1);
        sigprocmask(SIG_BLOCK, &usr1, &old);
        signal(SIGUSR1, on_usr1);
        printf("ready\n");
        fflush(stdout);
        while (!g_usr1)
            sigsuspend(&old);
        g_usr1 = 0;
        void *library = open_library(path);
        printf("opened\n");
        fflush(stdout);
        expect("cuInit", ((init_fn)symbol(library, "cuInit"))(0), 0);
        while (!g_usr1)
            sigsuspend(&old);
        unsigned long long pointer = 0;
        expect("cuMemAlloc_v2", ((alloc_fn)symbol(library, "cuMemAlloc_v2"))(&pointer, 4242), 0);
        return 0;
    }
    if (strcmp(mode, "pause") == 0) {
        void *library = open_library(path);
        expect("cuInit", ((init_fn)symbol(library, "cuInit"))(0), 0);
        sleep((unsigned)n);
        unsigned long long pointer = 0;
        expect("cuMemAlloc_v2", ((alloc_fn)symbol(library, "cuMemAlloc_v2"))(&pointer, 777), 0);
        return 0;
    }
    fprintf(stderr, "loader: unknown mode %s\n", mode);
    return 2;
}
