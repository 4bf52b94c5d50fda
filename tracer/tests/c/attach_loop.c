/*
 * attach_loop.c -- a program for `cudatrace run -p PID --gpu` tests, linked against the
 * STAND-IN libcuda (never NVIDIA's driver). It starts untraced and loops on the driver:
 *
 *   attach_loop ITERATIONS SLEEP_US [busy]
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
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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
    int busy_threads = argc == 4 ? 2 : 0;
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
    return 7;
}
