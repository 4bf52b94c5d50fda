/*
 * attach_loop.c -- a program for `cudatrace run -p PID --gpu` tests, linked against the
 * STAND-IN libcuda (never NVIDIA's driver). It starts untraced and loops on the driver:
 *
 *   attach_loop ITERATIONS SLEEP_US [busy | profile:LIBCUPTI]
 *
 * With `profile:LIBCUPTI` the program is its own CUPTI client before it says "ready", as
 * torch.profiler is: cuptiSubscribe, cuptiActivityRegisterCallbacks with its own buffers,
 * cuptiActivityEnable(CONCURRENT_KERNEL); at the end cuptiActivityFlushAll(FORCED) and
 * "profiler kernels N", the kernel records it got.
 *
 * With `busy`, two more threads run until the end: one allocates and frees memory without
 * pause, the other loads and unloads libm (dlopen, dlclose): the threads an injection that
 * calls dlopen at the wrong point would deadlock with.
 *
 *   cuInit(0); cuDevicePrimaryCtxRetain(&ctx, 0); cuCtxSetCurrent(ctx);
 *   cuModuleLoadData(&mod, image); cuModuleGetFunction(&f, mod, "_Z9attach_mev")
 *   prints "ready" (flushed), then ITERATIONS times:
 *       cuLaunchKernel(f, i % 5 + 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL); usleep(SLEEP_US)
 *   then prints "done ITERATIONS launches, N failed" and how many CUPTI clients the
 *   stand-in libcupti still records kernels and launches for ("recording N": 0 when
 *   nothing of cudatrace's is left enabled, -1 when no libcupti is loaded), and exits 7.
 *
 * Each 100 iterations it also prints "at I: MEAN ns" (the mean time of the last 100
 * launch calls), so a test can compare the speed before and after an attach.
 *
 * With ATTACH_LOOP_LOADER=1 in its environment it then opens /dev/null ("own file FD":
 * the descriptor the program's own open got) and asks the dynamic loader for the name of
 * cudatrace's injection library (dladdr of its first mapped page, found in /proc/self/maps):
 * "library known as NAME: VERDICT", VERDICT "the library" where NAME opens to the file
 * mapped there (same inode), else "another file" or "no file"; or "library not loaded".
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../../standin/cuda_standin.h"

static const unsigned char k_image[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33};

static volatile int g_stop;

static void *allocating(void *unused)
{
    (void)unused;
    while (!g_stop) {
        void *block = malloc(4096 + (size_t)(rand() % 65536));
        free(block);
    }
    return NULL;
}

static void *loading(void *unused)
{
    (void)unused;
    while (!g_stop) {
        void *libm = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
        if (libm)
            dlclose(libm);
    }
    return NULL;
}

/* The program's own CUPTI client (profile:LIBCUPTI). */
typedef struct {
    uint32_t kind;
} activity_record;
static int (*g_next_record)(uint8_t *, size_t, activity_record **);
static long g_profiler_kernels;

static void profiler_buffer_requested(uint8_t **buffer, size_t *size, size_t *max)
{
    *size = 1 << 20;
    *buffer = aligned_alloc(8, *size);
    *max = 0;
}

static void profiler_buffer_completed(void *ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    activity_record *record = NULL;
    while (g_next_record(buffer, valid, &record) == 0)
        if (record->kind == 10) /* CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL */
            g_profiler_kernels++;
    free(buffer);
}

static void *g_profiler;

static int start_profiler(const char *path)
{
    g_profiler = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_profiler)
        return 1;
    int (*subscribe)(void **, void *, void *) = (int (*)(void **, void *, void *))dlsym(g_profiler, "cuptiSubscribe");
    int (*register_callbacks)(void *, void *) = (int (*)(void *, void *))dlsym(g_profiler, "cuptiActivityRegisterCallbacks");
    int (*enable)(uint32_t) = (int (*)(uint32_t))dlsym(g_profiler, "cuptiActivityEnable");
    g_next_record = (int (*)(uint8_t *, size_t, activity_record **))dlsym(g_profiler, "cuptiActivityGetNextRecord");
    void *subscriber = NULL;
    if (!subscribe || !register_callbacks || !enable || !g_next_record)
        return 1;
    return subscribe(&subscriber, NULL, NULL) ||
           register_callbacks((void *)profiler_buffer_requested, (void *)profiler_buffer_completed) ||
           enable(10);
}

/* What the loader calls the injection library, and whether that name opens to it. */
static void show_loaders_name(void)
{
    printf("own file %d\n", open("/dev/null", O_RDONLY | O_CLOEXEC));
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[4096];
    unsigned long start = 0, offset = 1, inode = 0;
    while (maps && fgets(line, sizeof line, maps)) {
        if (strstr(line, "libcudatrace_inject") &&
            sscanf(line, "%lx-%*x %*s %lx %*s %lu", &start, &offset, &inode) == 3 && offset == 0)
            break;
        offset = 1;
    }
    if (maps)
        fclose(maps);
    Dl_info info;
    if (offset != 0 || !dladdr((void *)start, &info) || !info.dli_fname) {
        printf("library not loaded\n");
        return;
    }
    struct stat named;
    const char *verdict = stat(info.dli_fname, &named) != 0 ? "no file"
                          : named.st_ino == inode           ? "the library"
                                                            : "another file";
    printf("library known as %s: %s\n", info.dli_fname, verdict);
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: attach_loop ITERATIONS SLEEP_US [busy]\n");
        return 2;
    }
    pthread_t busy[2];
    int profiling = argc == 4 && strncmp(argv[3], "profile:", 8) == 0;
    int busy_threads = argc == 4 && !profiling ? 2 : 0;
    if (busy_threads) {
        pthread_create(&busy[0], NULL, allocating, NULL);
        pthread_create(&busy[1], NULL, loading, NULL);
    }
    long iterations = atol(argv[1]);
    long sleep_us = atol(argv[2]);
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    if (cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
        cuModuleLoadData(&mod, k_image) || cuModuleGetFunction(&f, mod, "_Z9attach_mev")) {
        fprintf(stderr, "attach_loop: set-up failed\n");
        return 3;
    }
    if (profiling && start_profiler(argv[3] + 8)) {
        fprintf(stderr, "attach_loop: the program's own CUPTI client did not start\n");
        return 3;
    }
    printf("ready\n");
    fflush(stdout);
    long failed = 0;
    long long spent = 0;
    for (long i = 0; i < iterations; i++) {
        long long before = now_ns();
        if (cuLaunchKernel(f, (unsigned)(i % 5 + 1), 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
            failed++;
        spent += now_ns() - before;
        if ((i + 1) % 100 == 0) {
            printf("at %ld: %lld ns\n", i + 1, spent / 100);
            spent = 0;
        }
        if (sleep_us > 0)
            usleep((useconds_t)sleep_us);
    }
    g_stop = 1;
    for (int t = 0; t < busy_threads; t++)
        pthread_join(busy[t], NULL);
    int recording = -1;
    void *cupti = dlopen("libcupti.so.13", RTLD_NOW | RTLD_NOLOAD);
    if (cupti) {
        int (*count)(uint32_t) = (int (*)(uint32_t))dlsym(cupti, "cudatrace_standin_cupti_recording");
        /* 307: cuLaunchKernel's CUPTI callback id. */
        recording = count ? count(307) : -2;
    }
    printf("done %ld launches, %ld failed\nrecording %d\n", iterations, failed, recording);
    if (getenv("ATTACH_LOOP_LOADER"))
        show_loaders_name();
    if (profiling) {
        int (*flush)(uint32_t) = (int (*)(uint32_t))dlsym(g_profiler, "cuptiActivityFlushAll");
        flush(1);
        printf("profiler kernels %ld\n", g_profiler_kernels);
    }
    return 7;
}
