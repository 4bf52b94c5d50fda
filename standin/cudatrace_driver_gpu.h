/*
 * cudatrace_driver_gpu.h -- the GPU modes of cudatrace-driver added for issue 24
 * (included by cudatrace_driver.c; the stand-in libcuda and libcupti have the rules).
 *
 * MODE `profiler` -- the program has a CUPTI client of its own (as torch.profiler's Kineto
 *   is), through the libcupti named in CUDATRACE_CUPTI (the stand-in; the same file the
 *   injection library loads):
 *    1  cuInit(0); cuDeviceGet; cuDevicePrimaryCtxRetain; cuCtxSetCurrent;
 *       cuModuleLoadData(&mod, image); cuModuleGetFunction(&f, mod, "_Z8profiledv")
 *    2  100 x cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL)
 *    3  the profiler starts: cuptiSubscribe (must succeed: no other callback subscriber),
 *       cuptiActivityRegisterTimestampCallback (its own clock: CLOCK_REALTIME + 1 h; refused
 *       beside other subscribers, CUPTI_STANDIN_MULTI=1),
 *       cuptiActivityRegisterCallbacks (its own buffers), cuptiActivityEnable of
 *       CONCURRENT_KERNEL, MEMCPY, MEMSET and DRIVER
 *    4  200 x the same launch
 *    5  the profiler stops: cuptiActivityDisable of the four kinds,
 *       cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), cuptiUnsubscribe; prints
 *       "profiler: K kernels, A api records\n" (what its buffers held) to stdout
 *    6  waits (20 s at most) until a CUPTI client records kernels and cuLaunchKernel's
 *       API records again (cudatrace_standin_cupti_recording: cudatrace's library took
 *       CUPTI back), as a program would go on with other work meanwhile
 *    7  300 x the same launch; cuCtxSynchronize; exit 0.
 *
 * MODE `graphs` -- stream capture and graph launches (stand-in rules in
 *   libcuda_standin_graphs.h):
 *    1  cuInit(0); device, context; cuMemAlloc_v2(&d, 4096)      [d = 0x7f0000000000]
 *       cuStreamCreate(&s, 0)                                     [s = 0x1010]
 *       cuModuleLoadData(&mod, image)                             [mod = 0x1020]
 *       cuModuleGetFunction(&fa, mod, "_Z7kernelav")              [fa = 0x1030]
 *       cuModuleGetFunction(&fb, mod, "_Z7kernelbv")              [fb = 0x1040]
 *    2  cuLaunchKernel(fa, 1, 1, 1, 32, 1, 1, 0, s, ...): runs    (eager)
 *    3  cuStreamBeginCapture_v2(s, 0)                             [graph 0x1050]
 *    4  cuLaunchKernel(fa, 2, 1, 1, ...), cuMemsetD32Async(d, 7, 64, s) (256 bytes),
 *       cuLaunchKernel(fb, 3, 1, 1, ...), all on s: captured, nothing runs
 *    5  cuStreamEndCapture(s, &graph)                             [graph = 0x1050]
 *    6  cuGraphInstantiateWithFlags(&exec, graph, 0)              [exec = 0x1060]
 *    7  3 x cuGraphLaunch(exec, s): each runs fa (grid 2), the memset, fb (grid 3)
 *    8  cuStreamSynchronize(s); exit 0.
 *
 * MODE `stale` -- one function handle reused for a second kernel (run with
 *   CUDA_STANDIN_REUSE_FUNCTIONS=1, as XLA's module reloads do):
 *    1  cuInit(0); device, context; cuModuleLoadData(&m1, image)  [m1 = 0x1010]
 *    2  cuModuleGetFunction(&f, m1, "gemm_fusion_dot_3")          [f = 0x1020]
 *    3  cuLaunchKernel(f, 1, 1, 1, ...)
 *    4  cuModuleUnload(m1); cuModuleLoadData(&m2, image)          [m2 = 0x1030]
 *    5  cuModuleGetFunction(&f, m2, "gemm_fusion_dot_6")          [f = 0x1020 again]
 *    6  cuLaunchKernel(f, 2, 1, 1, ...): CUPTI's record keeps the first name
 *    7  cuCtxSynchronize; exit 0.
 */

#include <dlfcn.h>
#include <stdint.h>
#include <time.h>

#define PROFILED_LAUNCHES_BEFORE 100
#define PROFILED_LAUNCHES 200
#define PROFILED_LAUNCHES_AFTER 300

static void launch_n(CUfunction f, int count)
{
    int n = 1;
    void *params[] = {&n};
    for (int i = 0; i < count; i++)
        OK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
}

/* The profiler's buffers: counted as they come back. */
static unsigned long g_profiler_kernels, g_profiler_apis;
typedef int (*next_record_fn)(uint8_t *, size_t, uint32_t **);
static next_record_fn g_next_record;

static void profiler_requested(uint8_t **buffer, size_t *size, size_t *max)
{
    *size = 1 << 20;
    *buffer = aligned_alloc(8, *size);
    *max = 0;
}

static void profiler_completed(void *ctx, uint32_t stream, uint8_t *buffer, size_t size,
                               size_t valid)
{
    (void)ctx;
    (void)stream;
    (void)size;
    uint32_t *record = NULL;
    while (g_next_record(buffer, valid, &record) == 0) {
        if (*record == 10)
            __atomic_add_fetch(&g_profiler_kernels, 1, __ATOMIC_RELAXED);
        else if (*record == 4)
            __atomic_add_fetch(&g_profiler_apis, 1, __ATOMIC_RELAXED);
    }
    free(buffer);
}

static uint64_t profiler_clock(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec + 3600000000000ULL;
}

#define CUPTI_OK(call)                                                  \
    do {                                                                \
        int rc_ = (call);                                               \
        if (rc_ != 0) {                                                 \
            fprintf(stderr, "cudatrace-driver: %s -> %d\n", #call, rc_); \
            exit(3);                                                    \
        }                                                               \
    } while (0)

static int mode_profiler(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction f;
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    OK(cuModuleLoadData(&mod, k_image));
    OK(cuModuleGetFunction(&f, mod, "_Z8profiledv"));
    launch_n(f, PROFILED_LAUNCHES_BEFORE);

    const char *path = getenv("CUDATRACE_CUPTI");
    void *cupti = dlopen(path != NULL ? path : "libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (cupti == NULL) {
        fprintf(stderr, "cudatrace-driver: %s\n", dlerror());
        return 3;
    }
    typedef int (*subscribe_fn)(void **, void *, void *);
    typedef int (*handle_fn)(void *);
    typedef int (*clock_fn)(uint64_t (*)(void));
    typedef int (*callbacks_fn)(void *, void *);
    typedef int (*u32_fn)(uint32_t);
#define SYM(type, name) type name = (type)dlsym(cupti, #name)
    SYM(subscribe_fn, cuptiSubscribe);
    SYM(handle_fn, cuptiUnsubscribe);
    SYM(clock_fn, cuptiActivityRegisterTimestampCallback);
    SYM(callbacks_fn, cuptiActivityRegisterCallbacks);
    SYM(u32_fn, cuptiActivityEnable);
    SYM(u32_fn, cuptiActivityDisable);
    SYM(u32_fn, cuptiActivityFlushAll);
    SYM(u32_fn, cudatrace_standin_cupti_recording);
#undef SYM
    g_next_record = (next_record_fn)dlsym(cupti, "cuptiActivityGetNextRecord");
    const uint32_t kinds[] = {10, 1, 2, 4}; /* kernel, memcpy, memset, driver */
    void *subscriber = NULL;
    CUPTI_OK(cuptiSubscribe(&subscriber, NULL, NULL));
    /* Refused (CUPTI_ERROR_NOT_COMPATIBLE) beside other subscribers: CUPTI's clock then. */
    if (cuptiActivityRegisterTimestampCallback != NULL)
        cuptiActivityRegisterTimestampCallback(profiler_clock);
    CUPTI_OK(cuptiActivityRegisterCallbacks((void *)profiler_requested, (void *)profiler_completed));
    for (int i = 0; i < 4; i++)
        CUPTI_OK(cuptiActivityEnable(kinds[i]));
    launch_n(f, PROFILED_LAUNCHES);
    for (int i = 0; i < 4; i++)
        CUPTI_OK(cuptiActivityDisable(kinds[i]));
    CUPTI_OK(cuptiActivityFlushAll(1));
    CUPTI_OK(cuptiUnsubscribe(subscriber));
    printf("profiler: %lu kernels, %lu api records\n", g_profiler_kernels, g_profiler_apis);
    fflush(stdout);

    for (int i = 0; i < 20000 && cudatrace_standin_cupti_recording(307) == 0; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    launch_n(f, PROFILED_LAUNCHES_AFTER);
    OK(cuCtxSynchronize());
    return 0;
}

static int mode_graphs(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr d;
    CUstream s;
    CUmodule mod;
    CUfunction fa, fb;
    CUgraph graph;
    CUgraphExec exec;
    int n = 1;
    void *params[] = {&n};
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    OK(cuMemAlloc_v2(&d, 4096));
    OK(cuStreamCreate(&s, 0));
    OK(cuModuleLoadData(&mod, k_image));
    OK(cuModuleGetFunction(&fa, mod, "_Z7kernelav"));
    OK(cuModuleGetFunction(&fb, mod, "_Z7kernelbv"));
    OK(cuLaunchKernel(fa, 1, 1, 1, 32, 1, 1, 0, s, params, NULL));
    OK(cuStreamBeginCapture_v2(s, 0));
    OK(cuLaunchKernel(fa, 2, 1, 1, 32, 1, 1, 0, s, params, NULL));
    OK(cuMemsetD32Async(d, 7, 64, s));
    OK(cuLaunchKernel(fb, 3, 1, 1, 32, 1, 1, 0, s, params, NULL));
    OK(cuStreamEndCapture(s, &graph));
    OK(cuGraphInstantiateWithFlags(&exec, graph, 0));
    for (int i = 0; i < 3; i++)
        OK(cuGraphLaunch(exec, s));
    OK(cuStreamSynchronize(s));
    return 0;
}

static int mode_stale(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule m1, m2;
    CUfunction f;
    int n = 1;
    void *params[] = {&n};
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    OK(cuModuleLoadData(&m1, k_image));
    OK(cuModuleGetFunction(&f, m1, "gemm_fusion_dot_3"));
    OK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    OK(cuModuleUnload(m1));
    OK(cuModuleLoadData(&m2, k_image));
    OK(cuModuleGetFunction(&f, m2, "gemm_fusion_dot_6"));
    OK(cuLaunchKernel(f, 2, 1, 1, 32, 1, 1, 0, NULL, params, NULL));
    OK(cuCtxSynchronize());
    return 0;
}
