/*
 * demo_inference.c -- cudatrace's no-GPU demo, built as `cudatrace-demo`.
 *
 * It looks like a small MLP inference script, but it drives the STAND-IN
 * libcuda (standin/libcuda_standin.c): there is no GPU and no NVIDIA driver
 * involved; every call returns immediately with fake values.  It exists so
 * that cudatrace can be demonstrated (timeline, kernel names, memory, leak
 * report) on any Linux machine.
 *
 * Build (see standin/README.md):
 *   gcc -O2 -g -Wall -Wextra -Werror -o OUT/cudatrace-demo \
 *       standin/demo_inference.c -LOUT -l:libcuda.so.1 -Wl,-rpath,'$ORIGIN' -lpthread
 *
 * Driver calls, in order:
 *   init:          cuInit(0); cuDeviceGet(&dev, 0); cuDevicePrimaryCtxRetain(&ctx, dev);
 *                  cuCtxSetCurrent(ctx)
 *   load weights:  for each layer i = 0..3 with sizes 1024*1024*4, 1024*1024*4,
 *                  1024*512*4, 512*10*4 bytes:
 *                    cuMemAlloc_v2(&w[i], size_i); cuMemcpyHtoD_v2(w[i], host, size_i)
 *   load kernels:  cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
 *                  for each of the 3 kernel names below:
 *                    cuLibraryGetKernel(&k, lib, name); cuKernelGetFunction(&f, k)
 *   prepare input: cuStreamCreate(&s, 0);
 *                  cuMemAlloc_v2(&d_in, 64*1024*4); cuMemAlloc_v2(&d_act, 64*1024*4);
 *                  cuMemAlloc_v2(&d_out, 64*10*4);
 *                  cuMemcpyHtoDAsync_v2(d_in, h_in, 64*1024*4, s)
 *   inference:     20 batches, each:
 *                    cuLaunchKernel(fill, 256,1,1, 128,1,1, 0, s, ...)
 *                    cuLaunchKernelEx({grid 8,16,1; block 128,1,1; smem 65536; s}, gemm, ...)
 *                    cuLaunchKernel(mul, 512,1,1, 128,1,1, 0, s, ...)
 *                    cuLaunchKernelEx({grid 4,8,1; block 256,1,1; smem 32768; s}, gemm, ...)
 *                    cuStreamSynchronize(s)
 *                  and usleep(200) between batches.
 *   fetch output:  cuMemcpyDtoHAsync_v2(h_out, d_out, 64*10*4, s); cuStreamSynchronize(s)
 *   cleanup:       cuMemFree_v2 of w[0..3], d_in, d_out -- d_act (262144 bytes) is
 *                  DELIBERATELY LEAKED so the demo shows cudatrace's leak report;
 *                  cuDevicePrimaryCtxRelease_v2(dev)
 *
 * Kernel names:
 *   gemm: sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas
 *   fill: _ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLi2EEEEviT0_T1_
 *   mul:  _ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastINS0_13BUnaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEEEEvRNS_18TensorIteratorBaseERKT_EUliE_EEviT1_
 */

#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_standin.h"

#define BATCH 64
#define HIDDEN 1024
#define CLASSES 10
#define N_BATCHES 20

static const char *const k_kernel_names[3] = {
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLi2EEEE"
    "viT0_T1_",
    "_ZN2at6native18elementwise_kernelILi128ELi2EZNS0_22gpu_kernel_impl_nocastINS0_"
    "13BUnaryFunctorIfffNS0_15binary_internal10MulFunctorIfEEEEEEvRNS_18TensorIteratorBaseE"
    "RKT_EUliE_EEviT1_",
};
enum { K_GEMM, K_FILL, K_MUL };

/* A fake fatbin image: only its address matters to the stand-in. */
static const unsigned char k_fatbin[128] = {0x50, 0xed, 0x55, 0xba, 1, 0, 0x10, 0};

static void check(CUresult r, const char *what)
{
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cudatrace-demo: %s failed with CUresult %d\n", what, (int)r);
        exit(1);
    }
}
#define CK(call) check((call), #call)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void stage(const char *name, double start)
{
    printf("  %-24s %9.3f ms\n", name, now_ms() - start);
}

int main(void)
{
    static const size_t layer_bytes[4] = {
        (size_t)1024 * 1024 * 4, (size_t)1024 * 1024 * 4, (size_t)1024 * 512 * 4,
        (size_t)512 * 10 * 4,
    };
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr w[4], d_in, d_act, d_out;
    CUlibrary lib;
    CUkernel kern[3];
    CUfunction fn[3];
    CUstream s;
    double t0, t_all;

    printf("cudatrace demo: driving the STAND-IN libcuda (no GPU, no NVIDIA driver)\n");
    printf("model: 4-layer MLP, batch %d, %d batches\n", BATCH, N_BATCHES);
    t_all = now_ms();

    /* ---- init ---- */
    t0 = now_ms();
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    stage("init", t0);

    /* ---- weight loading ---- */
    t0 = now_ms();
    float *host_w = malloc(layer_bytes[0]);
    if (host_w == NULL)
        return 1;
    for (size_t i = 0; i < layer_bytes[0] / sizeof(float); i++)
        host_w[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    size_t weight_total = 0;
    for (int i = 0; i < 4; i++) {
        CK(cuMemAlloc_v2(&w[i], layer_bytes[i]));
        CK(cuMemcpyHtoD_v2(w[i], host_w, layer_bytes[i]));
        weight_total += layer_bytes[i];
    }
    free(host_w);
    stage("load weights", t0);

    /* ---- kernels (lazy loading path: library -> kernel -> function) ---- */
    t0 = now_ms();
    CK(cuLibraryLoadData(&lib, k_fatbin, NULL, NULL, 0, NULL, NULL, 0));
    for (int i = 0; i < 3; i++) {
        CK(cuLibraryGetKernel(&kern[i], lib, k_kernel_names[i]));
        CK(cuKernelGetFunction(&fn[i], kern[i]));
    }
    stage("load kernels", t0);

    /* ---- input ---- */
    t0 = now_ms();
    float *h_in = calloc(BATCH * HIDDEN, sizeof(float));
    float *h_out = calloc(BATCH * CLASSES, sizeof(float));
    if (h_in == NULL || h_out == NULL)
        return 1;
    CK(cuStreamCreate(&s, 0));
    CK(cuMemAlloc_v2(&d_in, (size_t)BATCH * HIDDEN * 4));
    CK(cuMemAlloc_v2(&d_act, (size_t)BATCH * HIDDEN * 4));
    CK(cuMemAlloc_v2(&d_out, (size_t)BATCH * CLASSES * 4));
    CK(cuMemcpyHtoDAsync_v2(d_in, h_in, (size_t)BATCH * HIDDEN * 4, s));
    stage("prepare input", t0);

    /* ---- inference ---- */
    t0 = now_ms();
    int n_elems = BATCH * HIDDEN;
    float alpha = 1.0f, beta = 0.0f;
    void *fill_args[] = {&n_elems, &beta, &d_act};
    void *gemm1_args[] = {&d_in, &w[0], &d_act, &alpha, &beta};
    void *mul_args[] = {&n_elems, &d_act, &w[1]};
    void *gemm2_args[] = {&d_act, &w[3], &d_out, &alpha, &beta};
    CUlaunchConfig gemm1 = {
        .gridDimX = 8, .gridDimY = 16, .gridDimZ = 1,
        .blockDimX = 128, .blockDimY = 1, .blockDimZ = 1,
        .sharedMemBytes = 65536, .hStream = s, .attrs = NULL, .numAttrs = 0,
    };
    CUlaunchConfig gemm2 = {
        .gridDimX = 4, .gridDimY = 8, .gridDimZ = 1,
        .blockDimX = 256, .blockDimY = 1, .blockDimZ = 1,
        .sharedMemBytes = 32768, .hStream = s, .attrs = NULL, .numAttrs = 0,
    };
    for (int b = 0; b < N_BATCHES; b++) {
        if (b > 0)
            usleep(200);
        CK(cuLaunchKernel(fn[K_FILL], 256, 1, 1, 128, 1, 1, 0, s, fill_args, NULL));
        CK(cuLaunchKernelEx(&gemm1, fn[K_GEMM], gemm1_args, NULL));
        CK(cuLaunchKernel(fn[K_MUL], 512, 1, 1, 128, 1, 1, 0, s, mul_args, NULL));
        CK(cuLaunchKernelEx(&gemm2, fn[K_GEMM], gemm2_args, NULL));
        CK(cuStreamSynchronize(s));
    }
    stage("inference (20 batches)", t0);

    /* ---- output ---- */
    t0 = now_ms();
    CK(cuMemcpyDtoHAsync_v2(h_out, d_out, (size_t)BATCH * CLASSES * 4, s));
    CK(cuStreamSynchronize(s));
    stage("fetch output", t0);

    /* ---- cleanup ----
     * d_act is DELIBERATELY NOT FREED: the demo leaks this one 256 KiB
     * allocation so that cudatrace's leak report has something to show. */
    t0 = now_ms();
    for (int i = 0; i < 4; i++)
        CK(cuMemFree_v2(w[i]));
    CK(cuMemFree_v2(d_in));
    CK(cuMemFree_v2(d_out));
    CK(cuDevicePrimaryCtxRelease_v2(dev));
    stage("cleanup", t0);

    stage("total", t_all);
    printf("weights: %.1f MiB in 4 layers; %d kernel launches; output %dx%d\n",
           (double)weight_total / (1024.0 * 1024.0), N_BATCHES * 4, BATCH, CLASSES);
    printf("note: 1 device allocation (%d bytes at 0x%llx) is deliberately leaked\n",
           BATCH * HIDDEN * 4, (unsigned long long)d_act);

    free(h_in);
    free(h_out);
    return 0;
}
