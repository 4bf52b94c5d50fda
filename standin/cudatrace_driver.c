/*
 * cudatrace_driver.c -- test driver for cudatrace, built as `cudatrace-driver`
 * and linked against the STAND-IN libcuda (standin/libcuda_standin.c), never
 * against NVIDIA's driver.  Each mode makes a fixed, documented list of CUDA
 * driver calls so tests can assert exact events and argument values.
 *
 * Build (see standin/README.md):
 *   gcc -O2 -g -Wall -Wextra -Werror -o OUT/cudatrace-driver \
 *       standin/cudatrace_driver.c -LOUT -l:libcuda.so.1 -Wl,-rpath,'$ORIGIN' -lpthread
 *
 * Nothing is printed to stdout unless stated below.  If any call returns
 * something other than the expected result, a message goes to stderr and the
 * program exits with status 3.  Bad usage: message on stderr, exit 2.
 *
 * Values the stand-in returns (see libcuda_standin.c): device pointers come
 * from a bump allocator at 0x7f0000000000 (each allocation advances by its
 * size rounded up to 512); handles are 0x1000 + 0x10*n in creation order.
 * The values in [brackets] below are what the stand-in hands back.
 *
 * MODE `sequence` -- single-threaded, exactly these calls in this order, exit 0:
 *    1  cuInit(0)
 *    2  cuDeviceGet(&dev, 0)                               [dev = 0]
 *    3  cuDevicePrimaryCtxRetain(&ctx, dev)                [ctx = 0x1000]
 *    4  cuCtxSetCurrent(ctx)
 *    5  cuMemAlloc_v2(&d_a, 1048576)                       [d_a = 0x7f0000000000]
 *    6  cuMemAlloc_v2(&d_b, 4096)                          [d_b = 0x7f0000100000]
 *    7  cuMemAlloc_v2(&bad, 0)                             -> returns 1 (CUDA_ERROR_INVALID_VALUE)
 *       (h = malloc(1048576): host buffer, not a CUDA call)
 *    8  cuMemcpyHtoD_v2(d_a, h, 1048576)
 *    9  cuStreamCreate(&s, 0)                              [s = 0x1010]
 *   10  cuMemcpyHtoDAsync_v2(d_b, h, 4096, s)
 *   11  cuModuleLoadData(&mod, image)                      [mod = 0x1020]
 *   12  cuModuleGetFunction(&fn, mod, "_Z10vector_addPKfS0_Pfi")      [fn = 0x1030]
 *         (= vector_add(float const*, float const*, float*, int))
 *   13  cuLaunchKernel(fn, 4096, 2, 1, 256, 1, 3, 1024, s, params, NULL)
 *         (gridDim 4096x2x1, blockDim 256x1x3, sharedMemBytes 1024;
 *          blockDimZ, sharedMemBytes, hStream, kernelParams, extra are passed
 *          on the stack)
 *   14  cuLaunchKernelEx(&cfg, fn, params, NULL) with cfg =
 *         {gridDim 128,64,2; blockDim 32,8,4; sharedMemBytes 2048;
 *          hStream s; attrs NULL; numAttrs 0}
 *   15  cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0)   [lib = 0x1040]
 *   16  cuLibraryGetKernel(&kern, lib, "_ZN5torch6native10add_kernelEPKfS2_Pfi") [kern = 0x1050]
 *         (= torch::native::add_kernel(float const*, float const*, float*, int))
 *   17  cuKernelGetFunction(&fn2, kern)                    [fn2 = 0x1060]
 *   18  cuLaunchKernel((CUfunction)kern, 7, 1, 1, 64, 1, 1, 0, s, params, NULL)
 *         (launched through the CUkernel handle 0x1050, as CUDA 12+ allows)
 *   19  cuStreamSynchronize(s)
 *   20  cuMemcpyDtoH_v2(h, d_b, 4096)
 *   21  cuMemcpyDtoHAsync_v2(h, d_a, 65536, s)
 *   22  cuMemcpyDtoD_v2(d_b, d_a, 512)
 *   23  cuMemcpy2D_v2(&c2d) with c2d all zero except
 *         srcMemoryType = CU_MEMORYTYPE_HOST (1), srcHost = h, srcPitch = 256,
 *         dstMemoryType = CU_MEMORYTYPE_DEVICE (2), dstDevice = d_b, dstPitch = 256,
 *         WidthInBytes = 256, Height = 16
 *   24  cuMemsetD8_v2(d_a, 0xab, 777)
 *   25  cuCtxSynchronize()
 *   26  cuMemFree_v2(d_b)
 *   27  cuMemFree_v2(d_a)
 *   28  cuDevicePrimaryCtxRelease_v2(dev)
 *   params (both launches) = {&d_a, &d_b, &d_a, &n} with int n = 262144.
 *   image = a static 64-byte array starting with the ELF magic.
 *
 * MODE `loop N` -- cuCtxSynchronize() N times in a tight loop, then prints
 *   "N\n" (the decimal number) to stdout; exit 0.
 *
 * MODE `fork` --
 *   parent: cuInit(0); fork();
 *   child:  cuMemAlloc_v2(&p, 12345) [p = next bump pointer]; _exit(0)
 *   parent: waitpid(child); cuMemAlloc_v2(&p, 54321); exit 0 (exit 1 if the
 *           child did not exit 0).
 *   With a fresh process both allocations return 0x7f0000000000, since the
 *   child inherits the parent's (untouched) allocator state.
 *
 * MODE `forkexec PATH_TO_SELF` --
 *   parent: cuInit(0); fork();
 *   child:  execl(PATH_TO_SELF, PATH_TO_SELF, "child") (exit 127 if exec fails)
 *   parent: waitpid(child); cuMemAlloc_v2(&p, 54321); exit 0 (1 if the child
 *           did not exit 0).
 *
 * MODE `child` -- cuMemAlloc_v2(&p, 2222); cuInit(0); exit 0.
 *
 * MODE `threads` -- 4 pthreads, thread i (i = 0..3) calls
 *   cuMemAlloc_v2(&p, 1000 + i) exactly once.  All 4 threads are alive at
 *   the same time (they meet at a barrier before the call), so they have 4
 *   distinct TIDs.  The main thread makes no CUDA call.  Joined; exit 0.
 *
 * MODE `exit N` -- cuInit(0); exit(N).
 *
 * MODE `sleep SECS` -- cuInit(0); then repeat { cuCtxSynchronize();
 *   usleep(10000); } until SECS seconds (may be fractional) have passed on
 *   CLOCK_MONOTONIC; exit 0.
 *
 * MODE `wait-signal` -- installs a SIGUSR1 handler; cuInit(0); prints
 *   "ready\n" to stdout and flushes; waits (sigsuspend, race-free) until
 *   SIGUSR1 arrives; cuMemAlloc_v2(&p, 4242); exit 0.
 *
 * MODE `gpu` -- known GPU work, for GPU activity through CUPTI (with the stand-in
 *   libcupti, the calls marked "corr N" get correlation id N, in this order):
 *    1  cuInit(0)                     (loads CUDA_INJECTION64_PATH, if set)
 *    2  cuDeviceGet(&dev, 0); cuDevicePrimaryCtxRetain(&ctx, dev); cuCtxSetCurrent(ctx)
 *    3  cuMemAlloc_v2(&d, 1048576)                               [d = 0x7f0000000000]
 *    4  cuStreamCreate(&s, 0)                                    [s = 0x1010]
 *    5  cuModuleLoadData(&mod, image)                            [mod = 0x1020]
 *    6  cuModuleGetFunction(&fn, mod, "_Z10vector_addPKfS0_Pfi") [fn = 0x1030]
 *    7  cuModuleGetFunction(&fn_long, mod, LONG)                 [0x1040]
 *         LONG = "_Z" + 1,492 x 'a' + "_longv": a 1,500-byte name
 *    8  cuModuleGetFunction(&fn_huge, mod, HUGE)                 [0x1050]
 *         HUGE = "_Z" + 4,992 x 'b' + "_hugev": a 5,000-byte name (over 4 KiB)
 *    9  cuMemcpyHtoD_v2(d, h, 1048576)                                    corr 1
 *   10  cuLaunchKernel(fn, 4096, 2, 1, 256, 1, 3, 1024, s, params, NULL)  corr 2
 *   11  cuLaunchKernelEx(&cfg, fn, params, NULL), cfg = {grid 128,64,2;
 *         block 32,8,4; sharedMemBytes 2048; hStream s}                   corr 3
 *   12  cuLaunchKernel(fn_long, 7, 1, 1, 64, 1, 1, 0, NULL, params, NULL) corr 4
 *   13  cuLaunchKernel(fn_huge, 1, 1, 1, 32, 1, 1, 0, s, params, NULL)    corr 5
 *   14  cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL)
 *         -> returns 400 (CUDA_ERROR_INVALID_HANDLE): no GPU work        corr 6
 *   15  cuMemsetD8_v2(d, 0xab, 777)                                       corr 7
 *   16  cuMemsetD32Async(d, 7, 100, s)            (400 bytes)             corr 8
 *   17  cuMemcpyDtoHAsync_v2(h, d, 65536, s)                              corr 9
 *   18  cuStreamSynchronize(s); cuMemFree_v2(d); cuDevicePrimaryCtxRelease_v2(dev)
 *   exit 0.
 *
 * MODES `profiler`, `graphs`, `stale` -- a program's own CUPTI client, stream capture
 *   and graph launches, a reused function handle: cudatrace_driver_gpu.h.
 *
 * MODE `names` -- names of every length, exactly these calls:
 *    1  cuInit(0)
 *    2  cuModuleLoadData(&mod, image)                          [mod = 0x1000]
 *    3  cuModuleGetFunction(&f1, mod, NAME(29, 43))             [f1 = 0x1010]  1,500 bytes
 *    4  cuModuleGetFunction(&f2, mod, NAME(80, 89))             [f2 = 0x1020]  4,096 bytes
 *    5  cuModuleGetFunction(&f3, mod, NAME(80, 90))             [f3 = 0x1030]  4,097 bytes
 *    6  cuLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0)   [lib = 0x1040]
 *    7  cuLibraryGetKernel(&k, lib, NAME(99, 60))               [k = 0x1050]   5,017 bytes
 *    8  cuModuleLoad(&mod2, PATH)                               [mod2 = 0x1060]
 *         PATH = "/nonexistent/" + 1,987 x 'p' + ".cubin": 2,006 bytes
 *    9  cuLaunchKernel(fN, N, 1, 1, 32, 1, 1, 0, NULL, params, NULL) for f1, f2, f3 (N = 1..3)
 *   10  cuLaunchKernel((CUfunction)k, 4, 1, 1, 32, 1, 1, 0, NULL, params, NULL)
 *   NAME(n, f) is a mangled C++ name: "_ZN", then n (at most 99) namespaces "48nsKK" +
 *   44 x 'q' (KK = 00, 01, ... two digits), then the function "<f>kernel" + (f - 6) x 'z', then
 *   "Ev": 3 + 50 n + len(str(f)) + f + 2 bytes; it demangles to
 *   "ns00qq...q::ns01qq...q::...::kernelzz...z()".
 *
 * MODE `dirty` -- 32-bit arguments with garbage in the upper half of their 64-bit
 *   register or stack slot: each function is called through a pointer whose type
 *   declares its 32-bit parameters 64-bit, with DIRTY = 0xdeadbeef00000000 OR'ed in
 *   (int parameters: the low half is the value's two's complement):
 *    1  cuInit(DIRTY | 0)
 *    2  cuDeviceGet(&dev, DIRTY | 0)                             [dev = 0]
 *    3  cuStreamCreate(&s, DIRTY | 1)                            [s = 0x1000]
 *    4  cuStreamCreateWithPriority(&s2, DIRTY | 1, DIRTY | (unsigned)-3)  [s2 = 0x1010]
 *    5  cuModuleLoadData(&mod, image)                            [mod = 0x1020]
 *    6  cuModuleGetFunction(&fn, mod, "_Z10vector_addPKfS0_Pfi")  [fn = 0x1030]
 *    7  cuLaunchKernel(fn, DIRTY|4096, DIRTY|2, DIRTY|1, DIRTY|256, DIRTY|1, DIRTY|3,
 *         DIRTY|1024, s, params, NULL)    (blockDimZ onward on the stack)
 *    8  cuLaunchCooperativeKernel(fn, DIRTY|8, DIRTY|4, DIRTY|2, DIRTY|64, DIRTY|2,
 *         DIRTY|1, DIRTY|48, s, params)
 *    9  cuLibraryLoadData(&lib, image, NULL, NULL, DIRTY|3, NULL, NULL, DIRTY|2)
 *                                                                 [lib = 0x1040]
 *   10  cuModuleLoadDataEx(&mod2, image, DIRTY|5, NULL, NULL)    [mod2 = 0x1050]
 *   11  cuMemAlloc_v2(&d, 4096)                                  [d = 0x7f0000000000]
 *   12  cuMemsetD8_v2(d, 0xdeadbeefcafeba00|0xab, 16)   (unsigned char: 0xab)
 *   13  cuMemsetD16_v2(d, 0xdeadbeefcafe0000|0x1234, 16)  (unsigned short: 0x1234)
 *   14  cuMemsetD32Async(d, DIRTY|0x89abcdef, 16, s)
 *   15  cuEventCreate(&e, DIRTY|2)                               [e = 0x1060]
 *   16  cuEventRecordWithFlags(e, s, DIRTY|1)
 *   17  cuStreamWaitEvent(s, e, DIRTY|0)
 *   18  cuMemHostAlloc(&host, 64, DIRTY|4); cuMemFreeHost(host)
 *   exit 0.
 *
 * MODE `extras` -- streams, events, IPC, unified memory hints, graphs and copy batches:
 *    1  cuInit(0)
 *    2  cuStreamCreateWithPriority(&s, 1, -2)                    [s = 0x1000]
 *    3  cuStreamQuery(s)
 *    4  cuEventCreate(&e, 2)                                     [e = 0x1010]
 *    5  cuEventQuery(e)
 *    6  cuMemAlloc_v2(&d, 1048576)                               [d = 0x7f0000000000]
 *    7  cuIpcGetMemHandle(&handle, d)
 *         [handle = d's 8 bytes little-endian, then bytes 0xc8, 0xc9, ..., 0xff]
 *    8  cuIpcOpenMemHandle_v2(&peer, handle, 1)                  [peer = 0x7e0000000000]
 *         (the 64-byte handle by value: on the stack; Flags in the second register)
 *    9  cuMemPrefetchAsync_v2(d, 65536, {DEVICE (1), 0}, 0, s)
 *   10  cuMemPrefetchAsync_v2(d, 4096, {HOST_NUMA (3), 7}, 0, s)
 *   11  cuMemAdvise_v2(d, 1048576, SET_READ_MOSTLY (1), {DEVICE, 0})
 *   12  cuMemAdvise_v2(d, 1048576, SET_PREFERRED_LOCATION (3), {HOST (2), 0})
 *   13  cuGraphInstantiateWithFlags(&exec, (CUgraph)0x5000, 1)   [exec = 0x1020]
 *   14  cuGraphInstantiateWithParams(&exec2, (CUgraph)0x6000, &params {flags 4,
 *         hUploadStream s})                                      [exec2 = 0x1030; result 0]
 *   15  cuGraphInstantiateWithParams(&exec3, NULL, &params)     -> 400, result 1
 *   16  cuGraphExecUpdate_v2(exec, (CUgraph)0x5000, &info)       [info.result = 0]
 *   17  cuGraphExecUpdate_v2(exec, NULL, &info)                  -> 910, info.result = 1
 *   18  cuGraphLaunch(exec, s)
 *   19  cuMemcpyBatchAsync_v2(dsts, srcs, sizes {4096, 512, 100}, 3, NULL, NULL, 0, s)
 *   20  cuMemcpyBatchAsync_v2(dsts40, srcs40, sizes40 {1, 2, ..., 40}, 40, NULL, NULL, 0, s)
 *         (more sizes than cudatrace reads: 32)
 *   21  cuStreamSynchronize(s)
 *   22  cuIpcCloseMemHandle(peer)
 *   23  cuEventDestroy_v2(e)
 *   24  cuMemFree_v2(d)
 *   exit 0.
 *
 * MODE `queries` -- catalog calls and others, for --functions:
 *    1  cuInit(0)
 *    2  cuDeviceGetCount(&n) three times                        [n = 2]
 *    3  cuGetProcAddress_v2("cuMemAlloc", &pfn, 12080, 2, &status)
 *    4  cuDriverGetVersion(&v)                                  [v = 13000]
 *    5  cuDeviceGetCount(&n)
 *   exit 0.
 *
 * MODE `devices` -- two devices, their contexts made current by set, push/pop and create
 *   (device = the current context's; [a] marks a call on no known device):
 *    1  cuInit(0); cuDeviceGetCount(&n)                         [n = 2]
 *    2  cuDevicePrimaryCtxRetain(&c0, 0); cuDevicePrimaryCtxRetain(&c1, 1)
 *    3  cuMemAlloc_v2(&x, 1000)                                 [a]
 *    4  cuCtxSetCurrent(c0)
 *    5  cuMemAlloc_v2(&a0, 4096); cuMemcpyHtoD_v2(a0, h, 4096)  device 0
 *    6  cuModuleLoadData(&m, image); cuModuleGetFunction(&f, m, ...)
 *    7  cuLaunchKernel(f, 1,1,1, 32,1,1, 0, NULL, NULL, NULL)   device 0
 *    8  cuCtxPushCurrent_v2(c1)
 *    9  cuMemAlloc_v2(&a1, 8192); cuMemsetD8_v2(a1, 0, 8192); 2 x cuLaunchKernel(f, ...);
 *       cuMemcpyDtoD_v2(a1, a0, 1024)                          device 1
 *   10  cuCtxPopCurrent_v2(&p)                                  [p = c1]
 *   11  cuLaunchKernel(f, ...); cuMemFree_v2(a0)                device 0
 *   12  cuCtxCreate_v2(&c2, 0, 1); cuMemAlloc_v2(&a2, 100)      device 1 (c2 is current)
 *   13  cuCtxDestroy_v2(c2); cuMemAlloc_v2(&a3, 200)            device 0 (c2 popped)
 *   exit 0.
 *
 * MODE `threads-main` -- cuInit(0) on the main thread, then `threads` (4 threads each
 *   calling cuMemAlloc_v2(&p, 1000 + i) once, while the main thread waits); exit 0.
 */

#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_standin.h"

static void fail(const char *what, int got, int want)
{
    fprintf(stderr, "cudatrace-driver: %s returned %d, expected %d\n", what, got, want);
    exit(3);
}

#define EXPECT(call, want)                          \
    do {                                            \
        int r_ = (int)(call);                       \
        if (r_ != (want))                           \
            fail(#call, r_, (want));                \
    } while (0)
#define OK(call) EXPECT(call, CUDA_SUCCESS)

static void usage(void)
{
    fprintf(stderr,
            "usage: cudatrace-driver MODE [ARG]\n"
            "modes: sequence | loop N | fork | forkexec PATH_TO_SELF | child |\n"
            "       threads | threads-main | exit N | sleep SECS | wait-signal | gpu |\n"
            "       names | dirty | extras | queries | devices | profiler | graphs |\n"
            "       stale\n");
    exit(2);
}

static long parse_long(const char *s)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < 0)
        usage();
    return v;
}

/* A fake "cubin" image: only its address matters to the stand-in. */
static const unsigned char k_image[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33};

#define SEQ_MODULE_KERNEL "_Z10vector_addPKfS0_Pfi"
#define SEQ_LIBRARY_KERNEL "_ZN5torch6native10add_kernelEPKfS2_Pfi"

static int mode_sequence(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d_a, d_b, bad = 0;
    CUstream s;
    CUmodule mod;
    CUfunction fn, fn2;
    CUlibrary lib;
    CUkernel kern;
    int n = 262144;

    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    OK(cuMemAlloc_v2(&d_a, 1048576));
    OK(cuMemAlloc_v2(&d_b, 4096));
    EXPECT(cuMemAlloc_v2(&bad, 0), CUDA_ERROR_INVALID_VALUE);

    unsigned char *h = malloc(1048576);
    if (h == NULL)
        return 1;
    memset(h, 0x5a, 1048576);

    OK(cuMemcpyHtoD_v2(d_a, h, 1048576));
    OK(cuStreamCreate(&s, 0));
    OK(cuMemcpyHtoDAsync_v2(d_b, h, 4096, s));
    OK(cuModuleLoadData(&mod, k_image));
    OK(cuModuleGetFunction(&fn, mod, SEQ_MODULE_KERNEL));

    void *params[] = {&d_a, &d_b, &d_a, &n};
    OK(cuLaunchKernel(fn, 4096, 2, 1, 256, 1, 3, 1024, s, params, NULL));

    CUlaunchConfig cfg = {
        .gridDimX = 128, .gridDimY = 64, .gridDimZ = 2,
        .blockDimX = 32, .blockDimY = 8, .blockDimZ = 4,
        .sharedMemBytes = 2048, .hStream = s, .attrs = NULL, .numAttrs = 0,
    };
    OK(cuLaunchKernelEx(&cfg, fn, params, NULL));

    OK(cuLibraryLoadData(&lib, k_image, NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&kern, lib, SEQ_LIBRARY_KERNEL));
    OK(cuKernelGetFunction(&fn2, kern));
    OK(cuLaunchKernel((CUfunction)kern, 7, 1, 1, 64, 1, 1, 0, s, params, NULL));

    OK(cuStreamSynchronize(s));
    OK(cuMemcpyDtoH_v2(h, d_b, 4096));
    OK(cuMemcpyDtoHAsync_v2(h, d_a, 65536, s));
    OK(cuMemcpyDtoD_v2(d_b, d_a, 512));

    CUDA_MEMCPY2D c2d;
    memset(&c2d, 0, sizeof(c2d));
    c2d.srcMemoryType = CU_MEMORYTYPE_HOST;
    c2d.srcHost = h;
    c2d.srcPitch = 256;
    c2d.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c2d.dstDevice = d_b;
    c2d.dstPitch = 256;
    c2d.WidthInBytes = 256;
    c2d.Height = 16;
    OK(cuMemcpy2D_v2(&c2d));

    OK(cuMemsetD8_v2(d_a, 0xab, 777));
    OK(cuCtxSynchronize());
    OK(cuMemFree_v2(d_b));
    OK(cuMemFree_v2(d_a));
    OK(cuDevicePrimaryCtxRelease_v2(dev));

    free(h);
    return 0;
}

#define GPU_LONG_NAME_LEN 1500
#define GPU_HUGE_NAME_LEN 5000

/* "_Z" + fill + suffix, exactly len bytes. */
static char *kernel_name(size_t len, char fill, const char *suffix)
{
    char *name = malloc(len + 1);
    if (name == NULL)
        exit(1);
    size_t tail = strlen(suffix);
    memcpy(name, "_Z", 2);
    memset(name + 2, fill, len - 2 - tail);
    memcpy(name + len - tail, suffix, tail + 1);
    return name;
}

static int mode_gpu(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d;
    CUstream s;
    CUmodule mod;
    CUfunction fn, fn_long, fn_huge;
    int n = 262144;

    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    OK(cuMemAlloc_v2(&d, 1048576));
    OK(cuStreamCreate(&s, 0));
    OK(cuModuleLoadData(&mod, k_image));
    OK(cuModuleGetFunction(&fn, mod, SEQ_MODULE_KERNEL));
    char *long_name = kernel_name(GPU_LONG_NAME_LEN, 'a', "_longv");
    char *huge_name = kernel_name(GPU_HUGE_NAME_LEN, 'b', "_hugev");
    OK(cuModuleGetFunction(&fn_long, mod, long_name));
    OK(cuModuleGetFunction(&fn_huge, mod, huge_name));
    free(long_name);
    free(huge_name);

    unsigned char *h = calloc(1, 1048576);
    if (h == NULL)
        return 1;
    void *params[] = {&d, &d, &d, &n};
    OK(cuMemcpyHtoD_v2(d, h, 1048576));
    OK(cuLaunchKernel(fn, 4096, 2, 1, 256, 1, 3, 1024, s, params, NULL));
    CUlaunchConfig cfg = {
        .gridDimX = 128, .gridDimY = 64, .gridDimZ = 2,
        .blockDimX = 32, .blockDimY = 8, .blockDimZ = 4,
        .sharedMemBytes = 2048, .hStream = s, .attrs = NULL, .numAttrs = 0,
    };
    OK(cuLaunchKernelEx(&cfg, fn, params, NULL));
    OK(cuLaunchKernel(fn_long, 7, 1, 1, 64, 1, 1, 0, NULL, params, NULL));
    OK(cuLaunchKernel(fn_huge, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
    EXPECT(cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_ERROR_INVALID_HANDLE);
    OK(cuMemsetD8_v2(d, 0xab, 777));
    OK(cuMemsetD32Async(d, 7, 100, s));
    OK(cuMemcpyDtoHAsync_v2(h, d, 65536, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemFree_v2(d));
    OK(cuDevicePrimaryCtxRelease_v2(dev));
    free(h);
    return 0;
}

/* NAME(n, f) of the `names` mode: see the comment at the top. */
static char *mangled_name(int namespaces, int function_len)
{
    if (namespaces > 99 || function_len < 6 || function_len > 999)
        exit(2);
    size_t len = 3 + 50 * (size_t)namespaces + 3 + (size_t)function_len + 2;
    char *name = malloc(len + 1);
    if (name == NULL)
        exit(1);
    char *at = name;
    at += sprintf(at, "_ZN");
    for (int k = 0; k < namespaces; k++) {
        at += sprintf(at, "48ns%02d", k);
        memset(at, 'q', 44);
        at += 44;
    }
    at += sprintf(at, "%dkernel", function_len);
    memset(at, 'z', (size_t)function_len - 6);
    at += function_len - 6;
    strcpy(at, "Ev");
    return name;
}

static int mode_names(void)
{
    CUmodule mod, mod2;
    CUfunction f[3];
    CUlibrary lib;
    CUkernel k;
    int n = 1;
    void *params[] = {&n};
    static const int shapes[3][2] = {{29, 43}, {80, 89}, {80, 90}};

    OK(cuInit(0));
    OK(cuModuleLoadData(&mod, k_image));
    for (int i = 0; i < 3; i++) {
        char *name = mangled_name(shapes[i][0], shapes[i][1]);
        OK(cuModuleGetFunction(&f[i], mod, name));
        free(name);
    }
    OK(cuLibraryLoadData(&lib, k_image, NULL, NULL, 0, NULL, NULL, 0));
    char *huge = mangled_name(99, 60);
    OK(cuLibraryGetKernel(&k, lib, huge));
    free(huge);
    char path[2007];
    strcpy(path, "/nonexistent/");
    memset(path + 13, 'p', 1987);
    strcpy(path + 2000, ".cubin");
    OK(cuModuleLoad(&mod2, path));
    for (unsigned int i = 0; i < 3; i++)
        OK(cuLaunchKernel(f[i], i + 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    OK(cuLaunchKernel((CUfunction)k, 4, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    return 0;
}

/* 32-bit parameters declared 64-bit, so the caller writes whole 64-bit registers and
 * stack slots, garbage upper halves included. Calling through these is how a caller
 * whose registers or stack slots hold stale upper bits looks to the callee. */
#define DIRTY 0xdeadbeef00000000ULL
typedef unsigned long long u64;
typedef CUresult (*init64_t)(u64);
typedef CUresult (*device_get64_t)(CUdevice *, u64);
typedef CUresult (*stream_create64_t)(CUstream *, u64);
typedef CUresult (*stream_priority64_t)(CUstream *, u64, u64);
typedef CUresult (*launch64_t)(CUfunction, u64, u64, u64, u64, u64, u64, u64, CUstream, void **,
                               void **);
typedef CUresult (*cooperative64_t)(CUfunction, u64, u64, u64, u64, u64, u64, u64, CUstream,
                                    void **);
typedef CUresult (*library_load64_t)(CUlibrary *, const void *, CUjit_option *, void **, u64,
                                     CUlibraryOption *, void **, u64);
typedef CUresult (*module_load_ex64_t)(CUmodule *, const void *, u64, CUjit_option *, void **);
typedef CUresult (*memset64_t)(CUdeviceptr, u64, size_t);
typedef CUresult (*memset_async64_t)(CUdeviceptr, u64, size_t, CUstream);
typedef CUresult (*event_create64_t)(CUevent *, u64);
typedef CUresult (*event_record64_t)(CUevent, CUstream, u64);
typedef CUresult (*stream_wait64_t)(CUstream, CUevent, u64);
typedef CUresult (*host_alloc64_t)(void **, size_t, u64);

/* Through a volatile pointer, so the compiler cannot see the real callee's types. */
#define DIRTY_CALL(type, fn) ((type)(*(void *volatile *)&(void *){(void *)(fn)}))

static int mode_dirty(void)
{
    CUdevice dev;
    CUstream s, s2;
    CUmodule mod, mod2;
    CUfunction fn;
    CUlibrary lib;
    CUdeviceptr d;
    CUevent e;
    void *host;
    int n = 1;
    void *params[] = {&n};

    OK(DIRTY_CALL(init64_t, cuInit)(DIRTY | 0));
    OK(DIRTY_CALL(device_get64_t, cuDeviceGet)(&dev, DIRTY | 0));
    OK(DIRTY_CALL(stream_create64_t, cuStreamCreate)(&s, DIRTY | 1));
    OK(DIRTY_CALL(stream_priority64_t, cuStreamCreateWithPriority)(&s2, DIRTY | 1,
                                                                    DIRTY | (unsigned)-3));
    OK(cuModuleLoadData(&mod, k_image));
    OK(cuModuleGetFunction(&fn, mod, SEQ_MODULE_KERNEL));
    OK(DIRTY_CALL(launch64_t, cuLaunchKernel)(fn, DIRTY | 4096, DIRTY | 2, DIRTY | 1,
                                              DIRTY | 256, DIRTY | 1, DIRTY | 3, DIRTY | 1024,
                                              s, params, NULL));
    OK(DIRTY_CALL(cooperative64_t, cuLaunchCooperativeKernel)(fn, DIRTY | 8, DIRTY | 4,
                                                              DIRTY | 2, DIRTY | 64, DIRTY | 2,
                                                              DIRTY | 1, DIRTY | 48, s, params));
    OK(DIRTY_CALL(library_load64_t, cuLibraryLoadData)(&lib, k_image, NULL, NULL, DIRTY | 3,
                                                       NULL, NULL, DIRTY | 2));
    OK(DIRTY_CALL(module_load_ex64_t, cuModuleLoadDataEx)(&mod2, k_image, DIRTY | 5, NULL,
                                                          NULL));
    OK(cuMemAlloc_v2(&d, 4096));
    OK(DIRTY_CALL(memset64_t, cuMemsetD8_v2)(d, 0xdeadbeefcafeba00ULL | 0xab, 16));
    OK(DIRTY_CALL(memset64_t, cuMemsetD16_v2)(d, 0xdeadbeefcafe0000ULL | 0x1234, 16));
    OK(DIRTY_CALL(memset_async64_t, cuMemsetD32Async)(d, DIRTY | 0x89abcdef, 16, s));
    OK(DIRTY_CALL(event_create64_t, cuEventCreate)(&e, DIRTY | 2));
    OK(DIRTY_CALL(event_record64_t, cuEventRecordWithFlags)(e, s, DIRTY | 1));
    OK(DIRTY_CALL(stream_wait64_t, cuStreamWaitEvent)(s, e, DIRTY | 0));
    OK(DIRTY_CALL(host_alloc64_t, cuMemHostAlloc)(&host, 64, DIRTY | 4));
    OK(cuMemFreeHost(host));
    return 0;
}

static int mode_extras(void)
{
    CUstream s;
    CUevent e;
    CUdeviceptr d, peer;
    CUipcMemHandle handle;
    CUgraphExec exec, exec2, exec3 = NULL;
    CUgraphExecUpdateResultInfo info;

    OK(cuInit(0));
    OK(cuStreamCreateWithPriority(&s, 1, -2));
    OK(cuStreamQuery(s));
    OK(cuEventCreate(&e, 2));
    OK(cuEventQuery(e));
    OK(cuMemAlloc_v2(&d, 1048576));
    OK(cuIpcGetMemHandle(&handle, d));
    OK(cuIpcOpenMemHandle_v2(&peer, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    OK(cuMemPrefetchAsync_v2(d, 65536, (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0}, 0, s));
    OK(cuMemPrefetchAsync_v2(d, 4096, (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST_NUMA, 7}, 0, s));
    OK(cuMemAdvise_v2(d, 1048576, CU_MEM_ADVISE_SET_READ_MOSTLY,
                      (CUmemLocation){CU_MEM_LOCATION_TYPE_DEVICE, 0}));
    OK(cuMemAdvise_v2(d, 1048576, CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                      (CUmemLocation){CU_MEM_LOCATION_TYPE_HOST, 0}));
    OK(cuGraphInstantiateWithFlags(&exec, (CUgraph)0x5000, 1));
    CUDA_GRAPH_INSTANTIATE_PARAMS params = {.flags = 4, .hUploadStream = s};
    OK(cuGraphInstantiateWithParams(&exec2, (CUgraph)0x6000, &params));
    EXPECT(cuGraphInstantiateWithParams(&exec3, NULL, &params), CUDA_ERROR_INVALID_HANDLE);
    OK(cuGraphExecUpdate_v2(exec, (CUgraph)0x5000, &info));
    EXPECT(cuGraphExecUpdate_v2(exec, NULL, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE);
    OK(cuGraphLaunch(exec, s));
    CUdeviceptr dsts[40], srcs[40];
    size_t sizes[40];
    for (int i = 0; i < 40; i++) {
        dsts[i] = d + 4096 * (CUdeviceptr)i;
        srcs[i] = d + 512 * 1024 + 4096 * (CUdeviceptr)i;
        sizes[i] = (size_t)i + 1;
    }
    size_t three[3] = {4096, 512, 100};
    OK(cuMemcpyBatchAsync_v2(dsts, srcs, three, 3, NULL, NULL, 0, s));
    OK(cuMemcpyBatchAsync_v2(dsts, srcs, sizes, 40, NULL, NULL, 0, s));
    OK(cuStreamSynchronize(s));
    OK(cuIpcCloseMemHandle(peer));
    OK(cuEventDestroy_v2(e));
    OK(cuMemFree_v2(d));
    return 0;
}

static int mode_queries(void)
{
    int count, version;
    void *pfn;
    CUdriverProcAddressQueryResult status;
    OK(cuInit(0));
    for (int i = 0; i < 3; i++)
        OK(cuDeviceGetCount(&count));
    OK(cuGetProcAddress_v2("cuMemAlloc", &pfn, 12080, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                           &status));
    OK(cuDriverGetVersion(&version));
    OK(cuDeviceGetCount(&count));
    return 0;
}

static int mode_devices(void)
{
    int count;
    CUcontext c0, c1, c2, popped;
    CUdeviceptr x, a0, a1, a2, a3;
    CUmodule mod;
    CUfunction fn;
    static unsigned char h[4096];

    OK(cuInit(0));
    OK(cuDeviceGetCount(&count));
    if (count != 2)
        fail("cuDeviceGetCount's count", count, 2);
    OK(cuDevicePrimaryCtxRetain(&c0, 0));
    OK(cuDevicePrimaryCtxRetain(&c1, 1));
    OK(cuMemAlloc_v2(&x, 1000));
    OK(cuCtxSetCurrent(c0));
    OK(cuMemAlloc_v2(&a0, 4096));
    OK(cuMemcpyHtoD_v2(a0, h, 4096));
    OK(cuModuleLoadData(&mod, k_image));
    OK(cuModuleGetFunction(&fn, mod, SEQ_MODULE_KERNEL));
    OK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    OK(cuCtxPushCurrent_v2(c1));
    OK(cuMemAlloc_v2(&a1, 8192));
    OK(cuMemsetD8_v2(a1, 0, 8192));
    OK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    OK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    OK(cuMemcpyDtoD_v2(a1, a0, 1024));
    OK(cuCtxPopCurrent_v2(&popped));
    if (popped != c1)
        fail("cuCtxPopCurrent_v2's context", (int)(long)popped, (int)(long)c1);
    OK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL));
    OK(cuMemFree_v2(a0));
    OK(cuCtxCreate_v2(&c2, 0, 1));
    OK(cuMemAlloc_v2(&a2, 100));
    OK(cuCtxDestroy_v2(c2));
    OK(cuMemAlloc_v2(&a3, 200));
    return 0;
}

static int mode_loop(const char *arg)
{
    long n = parse_long(arg);
    for (long i = 0; i < n; i++)
        OK(cuCtxSynchronize());
    printf("%ld\n", n);
    return 0;
}

static int wait_child(pid_t pid)
{
    int status;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            perror("cudatrace-driver: waitpid");
            return 1;
        }
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "cudatrace-driver: child did not exit 0 (status 0x%x)\n", status);
        return 1;
    }
    return 0;
}

static int mode_fork(const char *exec_path)
{
    CUdeviceptr p;
    OK(cuInit(0));
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("cudatrace-driver: fork");
        return 1;
    }
    if (pid == 0) {
        if (exec_path != NULL) {
            execl(exec_path, exec_path, "child", (char *)NULL);
            perror("cudatrace-driver: execl");
            _exit(127);
        }
        if (cuMemAlloc_v2(&p, 12345) != CUDA_SUCCESS)
            _exit(3);
        _exit(0);
    }
    int rc = wait_child(pid);
    OK(cuMemAlloc_v2(&p, 54321));
    return rc;
}

static int mode_child(void)
{
    CUdeviceptr p;
    OK(cuMemAlloc_v2(&p, 2222));
    OK(cuInit(0));
    return 0;
}

#define N_THREADS 4
static pthread_barrier_t g_barrier;

static void *thread_main(void *arg)
{
    size_t idx = (size_t)arg;
    CUdeviceptr p;
    pthread_barrier_wait(&g_barrier);
    OK(cuMemAlloc_v2(&p, 1000 + idx));
    return NULL;
}

static int mode_threads(void)
{
    pthread_t t[N_THREADS];
    if (pthread_barrier_init(&g_barrier, NULL, N_THREADS) != 0)
        return 1;
    for (size_t i = 0; i < N_THREADS; i++)
        if (pthread_create(&t[i], NULL, thread_main, (void *)i) != 0)
            return 1;
    for (size_t i = 0; i < N_THREADS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&g_barrier);
    return 0;
}

static int mode_exit(const char *arg)
{
    long code = parse_long(arg);
    OK(cuInit(0));
    exit((int)code);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int mode_sleep(const char *arg)
{
    char *end;
    double secs = strtod(arg, &end);
    if (end == arg || *end != '\0' || secs < 0)
        usage();
    OK(cuInit(0));
    double start = now_s();
    while (now_s() - start < secs) {
        OK(cuCtxSynchronize());
        usleep(10000);
    }
    return 0;
}

static volatile sig_atomic_t g_got_usr1;

static void on_usr1(int sig)
{
    (void)sig;
    g_got_usr1 = 1;
}

static int mode_wait_signal(void)
{
    sigset_t block, old;
    struct sigaction sa;
    CUdeviceptr p;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    sigemptyset(&block);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &old); /* no race between check and wait */

    OK(cuInit(0));
    printf("ready\n");
    fflush(stdout);

    sigset_t wait_mask = old;
    sigdelset(&wait_mask, SIGUSR1);
    while (!g_got_usr1)
        sigsuspend(&wait_mask);
    sigprocmask(SIG_SETMASK, &old, NULL);

    OK(cuMemAlloc_v2(&p, 4242));
    return 0;
}

#include "cudatrace_driver_gpu.h"

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    const char *mode = argv[1];
    const char *arg = argc >= 3 ? argv[2] : NULL;

    if (strcmp(mode, "sequence") == 0 && argc == 2)
        return mode_sequence();
    if (strcmp(mode, "loop") == 0 && argc == 3)
        return mode_loop(arg);
    if (strcmp(mode, "fork") == 0 && argc == 2)
        return mode_fork(NULL);
    if (strcmp(mode, "forkexec") == 0 && argc == 3)
        return mode_fork(arg);
    if (strcmp(mode, "child") == 0 && argc == 2)
        return mode_child();
    if (strcmp(mode, "threads") == 0 && argc == 2)
        return mode_threads();
    if (strcmp(mode, "threads-main") == 0 && argc == 2) {
        /* The main thread's frame stays in the frame map while the threads call. */
        OK(cuInit(0));
        return mode_threads();
    }
    if (strcmp(mode, "names") == 0 && argc == 2)
        return mode_names();
    if (strcmp(mode, "dirty") == 0 && argc == 2)
        return mode_dirty();
    if (strcmp(mode, "extras") == 0 && argc == 2)
        return mode_extras();
    if (strcmp(mode, "queries") == 0 && argc == 2)
        return mode_queries();
    if (strcmp(mode, "exit") == 0 && argc == 3)
        return mode_exit(arg);
    if (strcmp(mode, "sleep") == 0 && argc == 3)
        return mode_sleep(arg);
    if (strcmp(mode, "wait-signal") == 0 && argc == 2)
        return mode_wait_signal();
    if (strcmp(mode, "gpu") == 0 && argc == 2)
        return mode_gpu();
    if (strcmp(mode, "profiler") == 0 && argc == 2)
        return mode_profiler();
    if (strcmp(mode, "graphs") == 0 && argc == 2)
        return mode_graphs();
    if (strcmp(mode, "stale") == 0 && argc == 2)
        return mode_stale();
    if (strcmp(mode, "devices") == 0 && argc == 2)
        return mode_devices();
    usage();
    return 2;
}
