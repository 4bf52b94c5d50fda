/*
 * libcuda_standin.c -- cudatrace's STAND-IN libcuda.so.1, for tests and the
 * no-GPU demo ONLY.
 *
 *      THIS IS NOT NVIDIA'S CUDA DRIVER.  It does no GPU work at all.
 *
 * It exports a subset of the CUDA driver API's symbol names with their real
 * signatures (x86-64 SysV: same argument order and widths), so that
 * cudatrace's uprobes can attach to it and read arguments exactly as they
 * would from the real libcuda.so.1.  Every function only validates a few
 * arguments the way the real driver does, fills its output parameters with
 * deterministic fake values and returns.  No sleeping, no printing.
 *
 * Build (see standin/README.md):
 *   gcc -shared -fPIC -O2 -fno-ipa-icf -g -Wall -Wextra -Werror \
 *       -Wl,-soname,libcuda.so.1 -o OUT/libcuda.so.1 standin/libcuda_standin.c
 *
 * The marker symbol `cudatrace_standin_libcuda` lets the tracer tell the
 * stand-in from the real driver.
 *
 * Fake values (deterministic, so tests can predict them):
 *
 *  - Device pointers (cuMemAlloc_v2, cuMemAllocManaged, cuMemAllocPitch_v2,
 *    cuMemAllocAsync[_ptsz], cuMemAllocFromPoolAsync[_ptsz]) come from ONE
 *    process-wide bump allocator: the first allocation returns
 *    0x7f0000000000 and each allocation advances the cursor by its size
 *    rounded up to a multiple of 512 bytes.  So every returned pointer is
 *    512-byte aligned and
 *        ptr[k] = 0x7f0000000000 + sum_{i<k} round_up(size[i], 512).
 *    (cuMemAllocPitch_v2: pitch = round_up(WidthInBytes, 512), size =
 *    pitch * Height.)  Failed calls do not advance the cursor.  Nothing is
 *    ever reused: freeing does not give addresses back.
 *  - Virtual address reservations (cuMemAddressReserve) come from a separate
 *    bump region starting at 0x7f8000000000, aligned to
 *    max(alignment, 2 MiB), each advancing by size rounded up to 2 MiB.
 *  - Handles (CUcontext from cuCtxCreate_*, CUstream, CUevent, CUmodule,
 *    CUfunction, CUlibrary, CUkernel, CUmemGenericAllocationHandle) are
 *    0x1000 + 0x10 * n, where n counts handle-producing calls in the process
 *    (0, 1, 2, ...), in call order.  Each call produces a fresh handle (also
 *    repeated cuModuleGetFunction with the same name).  Exception:
 *    cuDevicePrimaryCtxRetain returns the same context for a device every
 *    time; it takes its handle from the counter on the device's first retain.
 *  - Host pointers (cuMemAllocHost_v2, cuMemHostAlloc) are real malloc()
 *    memory; cuMemFreeHost free()s them.
 *  - cuDriverGetVersion reports 13000; cuDeviceGetCount reports 2 devices (0 and 1).
 *  - The current context is not tracked: cuCtxSetCurrent and cuCtxPushCurrent accept
 *    any context; cuCtxPopCurrent returns the one last pushed on the thread, NULL when
 *    none (a small per-thread stack).
 *
 * Errors that mirror the real driver:
 *  - any NULL output pointer                      -> CUDA_ERROR_INVALID_VALUE (1)
 *  - allocation / cuMemCreate of size 0           -> CUDA_ERROR_INVALID_VALUE (1)
 *  - cuModuleGetFunction / cuLibraryGetKernel with
 *    name == NULL                                 -> CUDA_ERROR_INVALID_VALUE (1)
 *    name == "missing_kernel"                     -> CUDA_ERROR_NOT_FOUND (500)
 *  - cuInit(flags != 0)                           -> CUDA_ERROR_INVALID_VALUE (1)
 *  - device ordinal other than 0 or 1             -> CUDA_ERROR_INVALID_DEVICE (101)
 *  - launching a NULL CUfunction / CUgraphExec    -> CUDA_ERROR_INVALID_HANDLE (400)
 * The stand-in does NOT require cuInit before other calls and does not track
 * allocations (freeing an unknown pointer succeeds).
 *
 * Injection and GPU activity (standin/README.md has the details):
 *  - cuInit(0) loads CUDA_INJECTION64_PATH once and calls its InitializeInjection, as
 *    the real driver does;
 *  - the stand-in libcupti registers hooks through the exported
 *    cudatrace_standin_set_activity_hooks (cupti_standin.h); each launch, copy and memset
 *    then reports its call (with its CUPTI callback id) and the GPU work it issued, with
 *    kernel names remembered from cuModuleGetFunction / cuLibraryGetKernel /
 *    cuKernelGetFunction.
 *
 * Distinct addresses: every exported function is noinline, touches its own
 * slot of a volatile counter array (so no two bodies are identical), and the
 * library is built with -fno-ipa-icf.  No exported function calls another
 * exported function (shared work lives in static helpers), so a uprobe on
 * one symbol never fires for a call made to a different symbol.
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_standin.h"
#include "cupti_standin.h"

#define EXPORT __attribute__((visibility("default"), noinline))

const char cudatrace_standin_libcuda[] __attribute__((visibility("default"))) =
    "cudatrace stand-in libcuda (not NVIDIA's driver)";

/* ---- internal state ------------------------------------------------------ */

#define STANDIN_DPTR_BASE 0x7f0000000000ULL
#define STANDIN_DPTR_ALIGN 512ULL
#define STANDIN_VA_BASE 0x7f8000000000ULL
#define STANDIN_VA_GRANULE (2ULL << 20)
#define STANDIN_IPC_BASE 0x7e0000000000ULL
#define STANDIN_IPC_STEP (2ULL << 20)
#define STANDIN_HANDLE_BASE 0x1000ULL
#define STANDIN_HANDLE_STEP 0x10ULL
#define STANDIN_DRIVER_VERSION 13000

/* One call counter per exported function; each function touches its own
 * slot, which keeps every function body unique. */
#define STANDIN_MAX_FUNCS 256
static volatile unsigned long long g_calls[STANDIN_MAX_FUNCS];
/* A plain (racy, harmless) increment, not an atomic one: x86 uprobes refuse to probe an
 * instruction with a LOCK prefix, and TOUCH() is often the first instruction. */
#define TOUCH() (g_calls[__COUNTER__] += 1ULL)

static unsigned long long g_next_dptr = STANDIN_DPTR_BASE;
static unsigned long long g_next_va = STANDIN_VA_BASE;
static unsigned long long g_next_ipc = STANDIN_IPC_BASE;
static unsigned long long g_handle_count;
#define STANDIN_DEVICES 2
static CUcontext g_primary_ctx[STANDIN_DEVICES];

static unsigned long long round_up(unsigned long long v, unsigned long long a)
{
    return (v + a - 1) / a * a;
}

static unsigned long long next_handle(void)
{
    unsigned long long n = __atomic_fetch_add(&g_handle_count, 1ULL, __ATOMIC_RELAXED);
    return STANDIN_HANDLE_BASE + STANDIN_HANDLE_STEP * n;
}

static CUresult dev_alloc(CUdeviceptr *dptr, size_t bytesize)
{
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *dptr = __atomic_fetch_add(&g_next_dptr, round_up(bytesize, STANDIN_DPTR_ALIGN),
                               __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

static CUresult host_alloc(void **pp, size_t bytesize)
{
    if (pp == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = malloc(bytesize);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pp = p;
    return CUDA_SUCCESS;
}

static CUresult va_reserve(CUdeviceptr *ptr, size_t size, size_t alignment)
{
    if (ptr == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment & (alignment - 1))
        return CUDA_ERROR_INVALID_VALUE;
    unsigned long long align = alignment > STANDIN_VA_GRANULE ? alignment : STANDIN_VA_GRANULE;
    unsigned long long len = round_up(size, STANDIN_VA_GRANULE);
    unsigned long long cur = __atomic_load_n(&g_next_va, __ATOMIC_RELAXED);
    unsigned long long start;
    do {
        start = round_up(cur, align);
    } while (!__atomic_compare_exchange_n(&g_next_va, &cur, start + len, 0,
                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    *ptr = start;
    return CUDA_SUCCESS;
}

#define MISSING_KERNEL_NAME "missing_kernel"

static CUresult lookup_name(const char *name)
{
    if (name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (strcmp(name, MISSING_KERNEL_NAME) == 0)
        return CUDA_ERROR_NOT_FOUND;
    return CUDA_SUCCESS;
}

/* IPC handles: the exporter's device pointer (8 bytes, little-endian), then bytes
 * 0xc8, 0xc9, ..., 0xff: predictable, and different for every pointer. */
static void ipc_handle_for(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
        handle->reserved[i] = (char)(i < 8 ? (dptr >> (8 * i)) & 0xffU : 0xc0U + (unsigned)i);
}

static CUresult check_device(CUdevice device)
{
    return device == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult check_location(CUmemLocation location)
{
    if (location.type < CU_MEM_LOCATION_TYPE_DEVICE ||
        location.type > CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT)
        return CUDA_ERROR_INVALID_VALUE;
    if (location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        return check_device(location.id);
    return CUDA_SUCCESS;
}

static CUresult new_handle_out(void *out)
{
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *(void **)out = (void *)(unsigned long)next_handle();
    return CUDA_SUCCESS;
}

static CUresult check_2d(const CUDA_MEMCPY2D *p)
{
    return p == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult check_3d(const CUDA_MEMCPY3D *p)
{
    return p == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

static CUresult check_launch(CUfunction f)
{
    return f == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

static CUresult check_launch_ex(const CUlaunchConfig *config, CUfunction f)
{
    if (config == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return check_launch(f);
}


/* ==== kernel names, activity hooks, injection ============================ */

/* Kernel names by handle number (handles are BASE + STEP * n), for activity records. */
#define STANDIN_MAX_NAMED 4096
static const char *g_handle_names[STANDIN_MAX_NAMED];

/* The name a handle was first given: like CUPTI, which keeps a function's name from its
 * first use, so a handle reused for another kernel keeps the first name in the records
 * (CUDA_STANDIN_REUSE_FUNCTIONS below). */
static void remember_name(const void *handle, const char *name)
{
    unsigned long long n = ((unsigned long long)handle - STANDIN_HANDLE_BASE) / STANDIN_HANDLE_STEP;
    if (handle == NULL || name == NULL || n >= STANDIN_MAX_NAMED)
        return;
    /* Kept for the life of the process: activity records point at it. */
    char *copy = strdup(name);
    const char *none = NULL;
    if (!__atomic_compare_exchange_n(&g_handle_names[n], &none, copy, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        free(copy);
}

/* CUDA_STANDIN_REUSE_FUNCTIONS=1: cuModuleUnload gives its module's function handles back
 * and cuModuleGetFunction reuses them (the latest first), as XLA's module reloads do with
 * the real driver. */
#define STANDIN_MAX_FUNCTIONS 64
static pthread_mutex_t g_function_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    CUmodule module;
    CUfunction function;
} g_functions[STANDIN_MAX_FUNCTIONS];
static int g_function_count;
static CUfunction g_free_functions[STANDIN_MAX_FUNCTIONS];
static int g_free_count;

static int reuse_functions(void)
{
    const char *value = getenv("CUDA_STANDIN_REUSE_FUNCTIONS");
    return value != NULL && strcmp(value, "1") == 0;
}

/* A handle given back by an unloaded module, or NULL. */
static CUfunction reused_function(CUmodule module)
{
    if (!reuse_functions())
        return NULL;
    pthread_mutex_lock(&g_function_lock);
    CUfunction f = g_free_count > 0 ? g_free_functions[--g_free_count] : NULL;
    pthread_mutex_unlock(&g_function_lock);
    (void)module;
    return f;
}

static void owned_function(CUmodule module, CUfunction f)
{
    if (!reuse_functions())
        return;
    pthread_mutex_lock(&g_function_lock);
    if (g_function_count < STANDIN_MAX_FUNCTIONS) {
        g_functions[g_function_count].module = module;
        g_functions[g_function_count].function = f;
        g_function_count++;
    }
    pthread_mutex_unlock(&g_function_lock);
}

static void unloaded_module(CUmodule module)
{
    if (!reuse_functions())
        return;
    pthread_mutex_lock(&g_function_lock);
    for (int i = 0; i < g_function_count; i++) {
        if (g_functions[i].module != module)
            continue;
        if (g_free_count < STANDIN_MAX_FUNCTIONS)
            g_free_functions[g_free_count++] = g_functions[i].function;
        g_functions[i--] = g_functions[--g_function_count];
    }
    pthread_mutex_unlock(&g_function_lock);
}

static const char *handle_name(const void *handle)
{
    unsigned long long n = ((unsigned long long)handle - STANDIN_HANDLE_BASE) / STANDIN_HANDLE_STEP;
    if (handle == NULL || n >= STANDIN_MAX_NAMED)
        return NULL;
    return __atomic_load_n(&g_handle_names[n], __ATOMIC_ACQUIRE);
}

/* Set by the stand-in libcupti when activity is enabled (cupti_standin.h). */
static const struct standin_activity_hooks *g_activity_hooks;

__attribute__((visibility("default"))) void
cudatrace_standin_set_activity_hooks(const struct standin_activity_hooks *hooks)
{
    __atomic_store_n(&g_activity_hooks, hooks, __ATOMIC_RELEASE);
}

static void activity_enter(uint32_t cbid, struct standin_api_call *call)
{
    const struct standin_activity_hooks *hooks =
        __atomic_load_n(&g_activity_hooks, __ATOMIC_ACQUIRE);
    call->cbid = cbid;
    call->correlation_id = 0;
    call->start = 0;
    call->callback_data = 0;
    if (hooks != NULL)
        hooks->api_enter(cbid, call);
}

static int captured(const struct standin_gpu_work *work);

static CUresult activity_exit(const struct standin_api_call *call, CUresult r,
                              const struct standin_gpu_work *work)
{
    /* Work on a stream being captured is a graph node: nothing runs. */
    if (r == CUDA_SUCCESS && work != NULL && work->kind != STANDIN_WORK_GRAPH && captured(work))
        work = NULL;
    const struct standin_activity_hooks *hooks =
        __atomic_load_n(&g_activity_hooks, __ATOMIC_ACQUIRE);
    if (hooks != NULL && call->correlation_id != 0)
        hooks->api_exit(call, (uint32_t)r, r == CUDA_SUCCESS ? work : NULL);
    return r;
}

static CUresult copy_done(const struct standin_api_call *call, CUresult r,
                          unsigned long long bytes, uint32_t copy_kind, uint32_t src_kind,
                          uint32_t dst_kind, CUstream stream, uint32_t async)
{
    struct standin_gpu_work work;
    memset(&work, 0, sizeof(work));
    work.kind = STANDIN_WORK_MEMCPY;
    work.bytes = bytes;
    work.copy_kind = copy_kind;
    work.src_kind = src_kind;
    work.dst_kind = dst_kind;
    work.stream = (uint64_t)(unsigned long)stream;
    work.async = async;
    return activity_exit(call, r, &work);
}

/* CUPTI's memory kind (1 pageable, 3 device) and memcpy kind for CUDA memory types. */
static uint32_t memory_kind(CUmemorytype type)
{
    return type == CU_MEMORYTYPE_HOST ? 1 : 3;
}

static uint32_t copy_kind(CUmemorytype src, CUmemorytype dst)
{
    int src_host = src == CU_MEMORYTYPE_HOST, dst_host = dst == CU_MEMORYTYPE_HOST;
    return src_host ? (dst_host ? 9 : 1) : (dst_host ? 2 : 8);
}

static CUresult copy2d_done(const struct standin_api_call *call, const CUDA_MEMCPY2D *p,
                            CUstream stream, uint32_t async)
{
    CUresult r = check_2d(p);
    if (r != CUDA_SUCCESS)
        return activity_exit(call, r, NULL);
    return copy_done(call, r, (unsigned long long)p->WidthInBytes * p->Height,
                     copy_kind(p->srcMemoryType, p->dstMemoryType),
                     memory_kind(p->srcMemoryType), memory_kind(p->dstMemoryType), stream, async);
}

static CUresult copy3d_done(const struct standin_api_call *call, const CUDA_MEMCPY3D *p,
                            CUstream stream, uint32_t async)
{
    CUresult r = check_3d(p);
    if (r != CUDA_SUCCESS)
        return activity_exit(call, r, NULL);
    return copy_done(call, r, (unsigned long long)p->WidthInBytes * p->Height * p->Depth,
                     copy_kind(p->srcMemoryType, p->dstMemoryType),
                     memory_kind(p->srcMemoryType), memory_kind(p->dstMemoryType), stream, async);
}

static CUresult memset_done(const struct standin_api_call *call, CUresult r,
                            unsigned long long bytes, uint32_t value, CUstream stream,
                            uint32_t async)
{
    struct standin_gpu_work work;
    memset(&work, 0, sizeof(work));
    work.kind = STANDIN_WORK_MEMSET;
    work.bytes = bytes;
    work.memset_value = value;
    work.dst_kind = 3; /* device */
    work.stream = (uint64_t)(unsigned long)stream;
    work.async = async;
    return activity_exit(call, r, &work);
}

/* The next launch's GPU times, per thread (cupti_standin.h). */
static __thread uint64_t t_next_start, t_next_end;

__attribute__((visibility("default"))) void cudatrace_standin_next_kernel_times(uint64_t start_ns,
                                                                               uint64_t end_ns)
{
    t_next_start = start_ns;
    t_next_end = end_ns;
}

static CUresult kernel_done(const struct standin_api_call *call, CUresult r, CUfunction f,
                            const unsigned int grid[3], const unsigned int block[3],
                            unsigned int shared, CUstream stream)
{
    if (r != CUDA_SUCCESS)
        return activity_exit(call, r, NULL);
    struct standin_gpu_work work;
    memset(&work, 0, sizeof(work));
    work.kind = STANDIN_WORK_KERNEL;
    memcpy(work.grid, grid, sizeof(work.grid));
    memcpy(work.block, block, sizeof(work.block));
    work.dynamic_shared = shared;
    work.stream = (uint64_t)(unsigned long)stream;
    work.name = handle_name(f);
    work.start_ns = t_next_start;
    work.end_ns = t_next_end;
    t_next_start = t_next_end = 0;
    return activity_exit(call, r, &work);
}

/* As the driver does at cuInit: load the library named in CUDA_INJECTION64_PATH and call
 * its InitializeInjection, once per process.  Failures are reported on stderr and
 * otherwise ignored (what the real driver does with them is not known). */
static void load_injection(void)
{
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (path == NULL || *path == '\0')
        return;
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "stand-in libcuda: cannot load CUDA_INJECTION64_PATH: %s\n", dlerror());
        return;
    }
    int (*initialize)(void) = (int (*)(void))dlsym(library, "InitializeInjection");
    if (initialize == NULL) {
        fprintf(stderr, "stand-in libcuda: %s has no InitializeInjection\n", path);
        return;
    }
    initialize();
}

static pthread_once_t g_injection_once = PTHREAD_ONCE_INIT;

/* ==== init / device / context ============================================ */

EXPORT CUresult cuInit(unsigned int Flags)
{
    TOUCH();
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&g_injection_once, load_injection);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    TOUCH();
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = STANDIN_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    TOUCH();
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= STANDIN_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    TOUCH();
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = STANDIN_DEVICES;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    TOUCH();
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= STANDIN_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    CUcontext ctx = __atomic_load_n(&g_primary_ctx[dev], __ATOMIC_ACQUIRE);
    if (ctx == NULL) {
        CUcontext fresh = (CUcontext)(unsigned long)next_handle();
        if (__atomic_compare_exchange_n(&g_primary_ctx[dev], &ctx, fresh, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            ctx = fresh;
    }
    *pctx = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    TOUCH();
    return dev < 0 || dev >= STANDIN_DEVICES ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    TOUCH();
    return dev < 0 || dev >= STANDIN_DEVICES ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

EXPORT CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    TOUCH();
    (void)flags;
    if (dev < 0 || dev >= STANDIN_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    return new_handle_out(pctx);
}

EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    TOUCH();
    (void)flags;
    if (dev < 0 || dev >= STANDIN_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    return new_handle_out(pctx);
}

EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, void *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev)
{
    TOUCH();
    (void)paramsArray;
    (void)numParams;
    (void)flags;
    if (dev < 0 || dev >= STANDIN_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    return new_handle_out(pctx);
}

EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, void *ctxCreateParams, unsigned int flags,
                               CUdevice dev)
{
    TOUCH();
    (void)ctxCreateParams;
    (void)flags;
    if (dev < 0 || dev >= STANDIN_DEVICES)
        return CUDA_ERROR_INVALID_DEVICE;
    return new_handle_out(pctx);
}

EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    TOUCH();
    return ctx == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    TOUCH();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
    TOUCH();
    (void)ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    TOUCH();
    (void)ctx;
    return CUDA_SUCCESS;
}

/* Push/pop: a small per-thread stack, so a pop returns what the thread pushed. */
static __thread CUcontext t_ctx_stack[16];
static __thread int t_ctx_depth;

static CUresult push_current(CUcontext ctx)
{
    if (ctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (t_ctx_depth == 16)
        return CUDA_ERROR_INVALID_VALUE;
    t_ctx_stack[t_ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

static CUresult pop_current(CUcontext *pctx)
{
    CUcontext ctx = t_ctx_depth > 0 ? t_ctx_stack[--t_ctx_depth] : NULL;
    if (pctx != NULL)
        *pctx = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxPushCurrent(CUcontext ctx)
{
    TOUCH();
    return push_current(ctx);
}

EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    TOUCH();
    return push_current(ctx);
}

EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx)
{
    TOUCH();
    return pop_current(pctx);
}

EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    TOUCH();
    return pop_current(pctx);
}

/* cuGetProcAddress_v2 is defined at the end of the file, after the table of
 * exported functions it resolves names against. */

/* ==== memory ============================================================== */

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    TOUCH();
    return dev_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    TOUCH();
    return host_alloc(pp, bytesize);
}

EXPORT CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    TOUCH();
    (void)Flags;
    return host_alloc(pp, bytesize);
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    TOUCH();
    (void)flags;
    return dev_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                   size_t Height, unsigned int ElementSizeBytes)
{
    TOUCH();
    if (dptr == NULL || pPitch == NULL || WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = round_up(WidthInBytes, STANDIN_DPTR_ALIGN);
    CUresult r = dev_alloc(dptr, pitch * Height);
    if (r == CUDA_SUCCESS)
        *pPitch = pitch;
    return r;
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return dev_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return dev_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream)
{
    TOUCH();
    (void)pool;
    (void)hStream;
    return dev_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream)
{
    TOUCH();
    (void)pool;
    (void)hStream;
    return dev_alloc(dptr, bytesize);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    TOUCH();
    (void)dptr;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeHost(void *p)
{
    TOUCH();
    free(p);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    TOUCH();
    (void)dptr;
    (void)hStream;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    TOUCH();
    (void)dptr;
    (void)hStream;
    return CUDA_SUCCESS;
}

/* ==== virtual memory management ========================================== */

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    TOUCH();
    (void)flags;
    if (handle == NULL || prop == NULL || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *handle = next_handle();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    TOUCH();
    (void)handle;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    TOUCH();
    (void)addr; /* address hints are ignored, as the real driver may */
    (void)flags;
    return va_reserve(ptr, size, alignment);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    TOUCH();
    (void)ptr;
    (void)size;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    TOUCH();
    (void)offset;
    (void)handle;
    if (ptr == 0 || size == 0 || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    TOUCH();
    if (ptr == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    TOUCH();
    if (ptr == 0 || size == 0 || desc == NULL || count == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* ==== copies ============================================================== */

/* CUPTI memcpy kinds and memory kinds (cupti_activity.h). */
#define KIND_HTOD 1, 1, 3
#define KIND_DTOH 2, 3, 1
#define KIND_DTOD 8, 3, 3
#define KIND_PTOP 10, 3, 3

EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy, &call);
    (void)dst; (void)src;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, NULL, 0);
}

EXPORT CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy_ptds, &call);
    (void)dst; (void)src;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, NULL, 0);
}

EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                              CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyAsync, &call);
    (void)dst; (void)src;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, hStream, 1);
}

EXPORT CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                                   CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyAsync_ptsz, &call);
    (void)dst; (void)src;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, hStream, 1);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyHtoD_v2, &call);
    (void)dstDevice; (void)srcHost;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_HTOD, NULL, 0);
}

EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost,
                                     size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyHtoD_v2_ptds, &call);
    (void)dstDevice; (void)srcHost;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_HTOD, NULL, 0);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoH_v2, &call);
    (void)dstHost; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOH, NULL, 0);
}

EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoH_v2_ptds, &call);
    (void)dstHost; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOH, NULL, 0);
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoD_v2, &call);
    (void)dstDevice; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, NULL, 0);
}

EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                     size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoD_v2_ptds, &call);
    (void)dstDevice; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, NULL, 0);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                     size_t ByteCount, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyHtoDAsync_v2, &call);
    (void)dstDevice; (void)srcHost;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_HTOD, hStream, 1);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost,
                                          size_t ByteCount, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyHtoDAsync_v2_ptsz, &call);
    (void)dstDevice; (void)srcHost;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_HTOD, hStream, 1);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                     CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoHAsync_v2, &call);
    (void)dstHost; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOH, hStream, 1);
}

EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice,
                                          size_t ByteCount, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoHAsync_v2_ptsz, &call);
    (void)dstHost; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOH, hStream, 1);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                     size_t ByteCount, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoDAsync_v2, &call);
    (void)dstDevice; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, hStream, 1);
}

EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                          size_t ByteCount, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyDtoDAsync_v2_ptsz, &call);
    (void)dstDevice; (void)srcDevice;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_DTOD, hStream, 1);
}

EXPORT CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                             CUcontext srcContext, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyPeer, &call);
    (void)dstDevice; (void)dstContext; (void)srcDevice; (void)srcContext;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_PTOP, NULL, 0);
}

EXPORT CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext,
                                  CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyPeer_ptds, &call);
    (void)dstDevice; (void)dstContext; (void)srcDevice; (void)srcContext;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_PTOP, NULL, 0);
}

EXPORT CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext,
                                  CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount,
                                  CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyPeerAsync, &call);
    (void)dstDevice; (void)dstContext; (void)srcDevice; (void)srcContext;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_PTOP, hStream, 1);
}

EXPORT CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext,
                                       CUdeviceptr srcDevice, CUcontext srcContext,
                                       size_t ByteCount, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpyPeerAsync_ptsz, &call);
    (void)dstDevice; (void)dstContext; (void)srcDevice; (void)srcContext;
    return copy_done(&call, CUDA_SUCCESS, ByteCount, KIND_PTOP, hStream, 1);
}

EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy2D_v2, &call);
    return copy2d_done(&call, pCopy, NULL, 0);
}

EXPORT CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy2D_v2_ptds, &call);
    return copy2d_done(&call, pCopy, NULL, 0);
}

EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy2DAsync_v2, &call);
    return copy2d_done(&call, pCopy, hStream, 1);
}

EXPORT CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy2DAsync_v2_ptsz, &call);
    return copy2d_done(&call, pCopy, hStream, 1);
}

EXPORT CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy3D_v2, &call);
    return copy3d_done(&call, pCopy, NULL, 0);
}

EXPORT CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *pCopy)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy3D_v2_ptds, &call);
    return copy3d_done(&call, pCopy, NULL, 0);
}

EXPORT CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy3DAsync_v2, &call);
    return copy3d_done(&call, pCopy, hStream, 1);
}

EXPORT CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemcpy3DAsync_v2_ptsz, &call);
    return copy3d_done(&call, pCopy, hStream, 1);
}

/* ==== memsets ============================================================= */

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD8_v2, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 1, uc, NULL, 0);
}

EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD8_v2_ptds, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 1, uc, NULL, 0);
}

EXPORT CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD16_v2, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 2, us, NULL, 0);
}

EXPORT CUresult cuMemsetD16_v2_ptds(CUdeviceptr dstDevice, unsigned short us, size_t N)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD16_v2_ptds, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 2, us, NULL, 0);
}

EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD32_v2, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 4, ui, NULL, 0);
}

EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD32_v2_ptds, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 4, ui, NULL, 0);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD8Async, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 1, uc, hStream, 1);
}

EXPORT CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                     CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD8Async_ptsz, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 1, uc, hStream, 1);
}

EXPORT CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                 CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD16Async, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 2, us, hStream, 1);
}

EXPORT CUresult cuMemsetD16Async_ptsz(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                      CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD16Async_ptsz, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 2, us, hStream, 1);
}

EXPORT CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                 CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD32Async, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 4, ui, hStream, 1);
}

EXPORT CUresult cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                      CUstream hStream)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuMemsetD32Async_ptsz, &call);
    (void)dstDevice;
    return memset_done(&call, CUDA_SUCCESS, (unsigned long long)N * 4, ui, hStream, 1);
}

/* ==== launches ============================================================ */

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX,
                               unsigned int blockDimY, unsigned int blockDimZ,
                               unsigned int sharedMemBytes, CUstream hStream,
                               void **kernelParams, void **extra)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuLaunchKernel, &call);
    (void)kernelParams; (void)extra;
    const unsigned int grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned int block[3] = {blockDimX, blockDimY, blockDimZ};
    return kernel_done(&call, check_launch(f), f, grid, block, sharedMemBytes, hStream);
}

EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                    unsigned int gridDimZ, unsigned int blockDimX,
                                    unsigned int blockDimY, unsigned int blockDimZ,
                                    unsigned int sharedMemBytes, CUstream hStream,
                                    void **kernelParams, void **extra)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuLaunchKernel_ptsz, &call);
    (void)kernelParams; (void)extra;
    const unsigned int grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned int block[3] = {blockDimX, blockDimY, blockDimZ};
    return kernel_done(&call, check_launch(f), f, grid, block, sharedMemBytes, hStream);
}

EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                          unsigned int gridDimZ, unsigned int blockDimX,
                                          unsigned int blockDimY, unsigned int blockDimZ,
                                          unsigned int sharedMemBytes, CUstream hStream,
                                          void **kernelParams)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuLaunchCooperativeKernel, &call);
    (void)kernelParams;
    const unsigned int grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned int block[3] = {blockDimX, blockDimY, blockDimZ};
    return kernel_done(&call, check_launch(f), f, grid, block, sharedMemBytes, hStream);
}

EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                               unsigned int gridDimZ, unsigned int blockDimX,
                                               unsigned int blockDimY, unsigned int blockDimZ,
                                               unsigned int sharedMemBytes, CUstream hStream,
                                               void **kernelParams)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuLaunchCooperativeKernel_ptsz, &call);
    (void)kernelParams;
    const unsigned int grid[3] = {gridDimX, gridDimY, gridDimZ};
    const unsigned int block[3] = {blockDimX, blockDimY, blockDimZ};
    return kernel_done(&call, check_launch(f), f, grid, block, sharedMemBytes, hStream);
}

EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                 void **kernelParams, void **extra)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuLaunchKernelEx, &call);
    (void)kernelParams; (void)extra;
    CUresult r = check_launch_ex(config, f);
    if (r != CUDA_SUCCESS)
        return kernel_done(&call, r, f, NULL, NULL, 0, NULL);
    const unsigned int grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned int block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    return kernel_done(&call, r, f, grid, block, config->sharedMemBytes, config->hStream);
}

EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                      void **kernelParams, void **extra)
{
    TOUCH();
    struct standin_api_call call;
    activity_enter(CBID_cuLaunchKernelEx_ptsz, &call);
    (void)kernelParams; (void)extra;
    CUresult r = check_launch_ex(config, f);
    if (r != CUDA_SUCCESS)
        return kernel_done(&call, r, f, NULL, NULL, 0, NULL);
    const unsigned int grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
    const unsigned int block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
    return kernel_done(&call, r, f, grid, block, config->sharedMemBytes, config->hStream);
}

#include "libcuda_standin_graphs.h"

/* ==== streams / events / sync ============================================= */

EXPORT CUresult cuStreamSynchronize(CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    TOUCH();
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    TOUCH();
    (void)hStream;
    (void)flags;
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream,
                                            unsigned int flags)
{
    TOUCH();
    (void)hStream;
    (void)flags;
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    TOUCH();
    (void)hStream;
    (void)Flags;
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    TOUCH();
    (void)hStream;
    (void)Flags;
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    TOUCH();
    (void)Flags;
    return new_handle_out(phStream);
}

EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    TOUCH();
    (void)Flags;
    return new_handle_out(phEvent);
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    TOUCH();
    (void)flags;
    (void)priority;
    return new_handle_out(phStream);
}

EXPORT CUresult cuStreamQuery(CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    TOUCH();
    (void)hStream;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventQuery(CUevent hEvent)
{
    TOUCH();
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent hEvent)
{
    TOUCH();
    return hEvent == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

/* ==== IPC, unified memory hints =========================================== */

EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    TOUCH();
    if (pHandle == NULL || dptr == 0)
        return CUDA_ERROR_INVALID_VALUE;
    ipc_handle_for(pHandle, dptr);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    TOUCH();
    (void)handle;
    if (pdptr == NULL || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = __atomic_fetch_add(&g_next_ipc, STANDIN_IPC_STEP, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    TOUCH();
    return dptr == 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                   CUstream hStream)
{
    TOUCH();
    (void)count; (void)hStream;
    return devPtr == 0 ? CUDA_ERROR_INVALID_VALUE : check_device(dstDevice);
}

EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice,
                                        CUstream hStream)
{
    TOUCH();
    (void)count; (void)hStream;
    return devPtr == 0 ? CUDA_ERROR_INVALID_VALUE : check_device(dstDevice);
}

EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location,
                                      unsigned int flags, CUstream hStream)
{
    TOUCH();
    (void)count; (void)flags; (void)hStream;
    return devPtr == 0 ? CUDA_ERROR_INVALID_VALUE : check_location(location);
}

EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count,
                                           CUmemLocation location, unsigned int flags,
                                           CUstream hStream)
{
    TOUCH();
    (void)count; (void)flags; (void)hStream;
    return devPtr == 0 ? CUDA_ERROR_INVALID_VALUE : check_location(location);
}

EXPORT CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                            CUdevice device)
{
    TOUCH();
    (void)count;
    if (devPtr == 0 || advice < CU_MEM_ADVISE_SET_READ_MOSTLY ||
        advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    return check_device(device);
}

EXPORT CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice,
                               CUmemLocation location)
{
    TOUCH();
    (void)count;
    if (devPtr == 0 || advice < CU_MEM_ADVISE_SET_READ_MOSTLY ||
        advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY)
        return CUDA_ERROR_INVALID_VALUE;
    return check_location(location);
}

/* ==== graphs ============================================================== */

EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                            unsigned long long flags)
{
    TOUCH();
    (void)flags;
    if (phGraphExec == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (hGraph == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = new_handle_out(phGraphExec);
    if (r == CUDA_SUCCESS)
        instantiated(*phGraphExec, hGraph);
    return r;
}

static CUresult instantiate_with_params(CUgraphExec *phGraphExec, CUgraph hGraph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (phGraphExec == NULL || params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    params->hErrNode_out = NULL;
    if (hGraph == NULL) {
        params->result_out = 1; /* CUDA_GRAPH_INSTANTIATE_ERROR */
        return CUDA_ERROR_INVALID_HANDLE;
    }
    params->result_out = 0; /* CUDA_GRAPH_INSTANTIATE_SUCCESS */
    CUresult r = new_handle_out(phGraphExec);
    if (r == CUDA_SUCCESS)
        instantiated(*phGraphExec, hGraph);
    return r;
}

EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    TOUCH();
    return instantiate_with_params(phGraphExec, hGraph, instantiateParams);
}

EXPORT CUresult cuGraphInstantiateWithParams_ptsz(
    CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
    TOUCH();
    return instantiate_with_params(phGraphExec, hGraph, instantiateParams);
}

EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                     CUgraphExecUpdateResultInfo *resultInfo)
{
    TOUCH();
    if (hGraphExec == NULL || resultInfo == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    resultInfo->errorNode = NULL;
    resultInfo->errorFromNode = NULL;
    if (hGraph == NULL) {
        resultInfo->result = 1; /* CU_GRAPH_EXEC_UPDATE_ERROR */
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    resultInfo->result = 0; /* CU_GRAPH_EXEC_UPDATE_SUCCESS */
    return CUDA_SUCCESS;
}

/* ==== copy batches ======================================================== */

static CUresult check_batch(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count)
{
    return dsts == NULL || srcs == NULL || sizes == NULL || count == 0
               ? CUDA_ERROR_INVALID_VALUE
               : CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyBatchAsync(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                   size_t count, CUmemcpyAttributes *attrs, size_t *attrsIdxs,
                                   size_t numAttrs, size_t *failIdx, CUstream hStream)
{
    TOUCH();
    (void)attrs; (void)attrsIdxs; (void)numAttrs; (void)hStream;
    CUresult r = check_batch(dsts, srcs, sizes, count);
    if (failIdx != NULL)
        *failIdx = r == CUDA_SUCCESS ? (size_t)-1 : 0;
    return r;
}

EXPORT CUresult cuMemcpyBatchAsync_v2(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                      size_t count, CUmemcpyAttributes *attrs,
                                      size_t *attrsIdxs, size_t numAttrs, CUstream hStream)
{
    TOUCH();
    (void)attrs; (void)attrsIdxs; (void)numAttrs; (void)hStream;
    return check_batch(dsts, srcs, sizes, count);
}

EXPORT CUresult cuMemcpyBatchAsync_v2_ptsz(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes,
                                           size_t count, CUmemcpyAttributes *attrs,
                                           size_t *attrsIdxs, size_t numAttrs,
                                           CUstream hStream)
{
    TOUCH();
    (void)attrs; (void)attrsIdxs; (void)numAttrs; (void)hStream;
    return check_batch(dsts, srcs, sizes, count);
}

/* ==== modules / libraries / kernels ======================================= */

EXPORT CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    TOUCH();
    if (fname == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle_out(module); /* the file is never opened */
}

EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    TOUCH();
    if (image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle_out(module);
}

EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
                                   CUjit_option *options, void **optionValues)
{
    TOUCH();
    (void)numOptions; (void)options; (void)optionValues;
    if (image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle_out(module);
}

EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    TOUCH();
    if (fatCubin == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle_out(module);
}

EXPORT CUresult cuModuleUnload(CUmodule hmod)
{
    TOUCH();
    if (hmod == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    unloaded_module(hmod);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    TOUCH();
    if (hfunc == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = lookup_name(name);
    if (r != CUDA_SUCCESS)
        return r;
    CUfunction reused = reused_function(hmod);
    if (reused != NULL)
        *hfunc = reused;
    else
        r = new_handle_out(hfunc);
    if (r == CUDA_SUCCESS) {
        remember_name(*hfunc, name);
        owned_function(hmod, *hfunc);
    }
    return r;
}

EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
                                  void **jitOptionsValues, unsigned int numJitOptions,
                                  CUlibraryOption *libraryOptions, void **libraryOptionValues,
                                  unsigned int numLibraryOptions)
{
    TOUCH();
    (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    if (code == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle_out(library);
}

EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
                                      CUjit_option *jitOptions, void **jitOptionsValues,
                                      unsigned int numJitOptions,
                                      CUlibraryOption *libraryOptions,
                                      void **libraryOptionValues,
                                      unsigned int numLibraryOptions)
{
    TOUCH();
    (void)jitOptions; (void)jitOptionsValues; (void)numJitOptions;
    (void)libraryOptions; (void)libraryOptionValues; (void)numLibraryOptions;
    if (fileName == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return new_handle_out(library); /* the file is never opened */
}

EXPORT CUresult cuLibraryUnload(CUlibrary library)
{
    TOUCH();
    return library == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
}

EXPORT CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    TOUCH();
    (void)library;
    if (pKernel == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = lookup_name(name);
    if (r != CUDA_SUCCESS)
        return r;
    r = new_handle_out(pKernel);
    if (r == CUDA_SUCCESS)
        remember_name(*pKernel, name);
    return r;
}

EXPORT CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    TOUCH();
    if (kernel == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = new_handle_out(pFunc);
    if (r == CUDA_SUCCESS)
        remember_name(*pFunc, handle_name(kernel));
    return r;
}

/* ==== cuGetProcAddress_v2 ================================================= */

/* Every exported function except cuGetProcAddress_v2 itself (added below). */
#define STANDIN_EXPORTS(X)                                                           \
    X(cuInit) X(cuDriverGetVersion) X(cuDeviceGet) X(cuDeviceGetCount)               \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                         \
    X(cuDevicePrimaryCtxRelease_v2) X(cuCtxCreate_v2) X(cuCtxCreate_v3)              \
    X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuCtxSynchronize) X(cuCtxSynchronize_v2)  \
    X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent)   \
    X(cuCtxPopCurrent_v2) X(cuCtxCreate)                                             \
    X(cuMemAlloc_v2) X(cuMemAllocHost_v2) X(cuMemHostAlloc) X(cuMemAllocManaged)     \
    X(cuMemAllocPitch_v2) X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz)                 \
    X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz) X(cuMemFree_v2)       \
    X(cuMemFreeHost) X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz)                        \
    X(cuMemCreate) X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree)        \
    X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                                      \
    X(cuMemcpy) X(cuMemcpy_ptds) X(cuMemcpyAsync) X(cuMemcpyAsync_ptsz)              \
    X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD_v2_ptds) X(cuMemcpyDtoH_v2)                    \
    X(cuMemcpyDtoH_v2_ptds) X(cuMemcpyDtoD_v2) X(cuMemcpyDtoD_v2_ptds)               \
    X(cuMemcpyHtoDAsync_v2) X(cuMemcpyHtoDAsync_v2_ptsz) X(cuMemcpyDtoHAsync_v2)     \
    X(cuMemcpyDtoHAsync_v2_ptsz) X(cuMemcpyDtoDAsync_v2) X(cuMemcpyDtoDAsync_v2_ptsz) \
    X(cuMemcpyPeer) X(cuMemcpyPeer_ptds) X(cuMemcpyPeerAsync)                        \
    X(cuMemcpyPeerAsync_ptsz) X(cuMemcpy2D_v2) X(cuMemcpy2D_v2_ptds)                 \
    X(cuMemcpy2DAsync_v2) X(cuMemcpy2DAsync_v2_ptsz) X(cuMemcpy3D_v2)                \
    X(cuMemcpy3D_v2_ptds) X(cuMemcpy3DAsync_v2) X(cuMemcpy3DAsync_v2_ptsz)           \
    X(cuMemsetD8_v2) X(cuMemsetD8_v2_ptds) X(cuMemsetD16_v2) X(cuMemsetD16_v2_ptds)  \
    X(cuMemsetD32_v2) X(cuMemsetD32_v2_ptds) X(cuMemsetD8Async)                      \
    X(cuMemsetD8Async_ptsz) X(cuMemsetD16Async) X(cuMemsetD16Async_ptsz)             \
    X(cuMemsetD32Async) X(cuMemsetD32Async_ptsz)                                     \
    X(cuLaunchKernel) X(cuLaunchKernel_ptsz) X(cuLaunchKernelEx)                     \
    X(cuLaunchKernelEx_ptsz) X(cuLaunchCooperativeKernel)                            \
    X(cuLaunchCooperativeKernel_ptsz) X(cuGraphLaunch) X(cuGraphLaunch_ptsz)         \
    X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz) X(cuEventSynchronize)         \
    X(cuEventRecord) X(cuEventRecord_ptsz) X(cuEventRecordWithFlags)                 \
    X(cuEventRecordWithFlags_ptsz) X(cuStreamWaitEvent) X(cuStreamWaitEvent_ptsz)    \
    X(cuStreamCreate) X(cuEventCreate)                                               \
    X(cuStreamCreateWithPriority) X(cuStreamQuery) X(cuStreamQuery_ptsz)             \
    X(cuEventQuery) X(cuEventDestroy_v2)                                             \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)             \
    X(cuMemPrefetchAsync) X(cuMemPrefetchAsync_ptsz) X(cuMemPrefetchAsync_v2)        \
    X(cuMemPrefetchAsync_v2_ptsz) X(cuMemAdvise) X(cuMemAdvise_v2)                   \
    X(cuGraphInstantiateWithFlags) X(cuGraphInstantiateWithParams)                   \
    X(cuGraphInstantiateWithParams_ptsz) X(cuGraphExecUpdate_v2)                     \
    X(cuMemcpyBatchAsync) X(cuMemcpyBatchAsync_v2) X(cuMemcpyBatchAsync_v2_ptsz)     \
    X(cuModuleLoad) X(cuModuleLoadData) X(cuModuleLoadDataEx)                        \
    X(cuModuleLoadFatBinary) X(cuModuleUnload) X(cuModuleGetFunction)                \
    X(cuLibraryLoadData) X(cuLibraryLoadFromFile) X(cuLibraryUnload)                 \
    X(cuLibraryGetKernel) X(cuKernelGetFunction)

struct export_entry {
    const char *name;
    void *addr;
};

static void *find_export(const char *name);

/*
 * Resolution rules (modelled on the real driver 580.159.04, as measured there):
 *  - callers pass the BASE name ("cuMemAlloc", "cuLaunchKernel", ...);
 *  - with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM in flags, the
 *    per-thread variants are preferred: NAME_v2_ptsz, NAME_v2_ptds,
 *    NAME_ptsz, NAME_ptds (first one exported wins);
 *  - then NAME_v2, then NAME itself;
 *  - version-dependent special cases: cuCtxCreate -> _v4 (cudaVersion >=
 *    12050), _v3 (>= 11040), else _v2; cuCtxSynchronize -> _v2 only for
 *    cudaVersion >= 13000 (the _v2 form takes a CUcontext argument);
 *  - an exact exported name is also accepted;
 *  - otherwise *pfn = NULL, *symbolStatus = SYMBOL_NOT_FOUND and
 *    CUDA_ERROR_NOT_FOUND is returned.
 * The returned addresses are those of the exported functions themselves.
 */
static void *resolve_proc(const char *symbol, int cudaVersion, unsigned long long flags)
{
    char buf[256];
    size_t len = strlen(symbol);
    if (len + sizeof("_v2_ptsz") > sizeof(buf))
        return NULL;

    if (strcmp(symbol, "cuCtxCreate") == 0) {
        const char *t = cudaVersion >= 12050   ? "cuCtxCreate_v4"
                        : cudaVersion >= 11040 ? "cuCtxCreate_v3"
                                               : "cuCtxCreate_v2";
        return find_export(t);
    }
    if (strcmp(symbol, "cuCtxSynchronize") == 0)
        return find_export(cudaVersion >= 13000 ? "cuCtxSynchronize_v2" : "cuCtxSynchronize");

    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        static const char *const pt[] = {"_v2_ptsz", "_v2_ptds", "_ptsz", "_ptds"};
        for (size_t i = 0; i < sizeof(pt) / sizeof(pt[0]); i++) {
            memcpy(buf, symbol, len);
            strcpy(buf + len, pt[i]);
            void *a = find_export(buf);
            if (a != NULL)
                return a;
        }
    }
    memcpy(buf, symbol, len);
    strcpy(buf + len, "_v2");
    void *a = find_export(buf);
    if (a != NULL)
        return a;
    return find_export(symbol);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    unsigned long long flags,
                                    CUdriverProcAddressQueryResult *symbolStatus)
{
    TOUCH();
    if (symbol == NULL || pfn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    void *a = resolve_proc(symbol, cudaVersion, flags);
    *pfn = a;
    if (symbolStatus != NULL)
        *symbolStatus = a != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                                  : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

#define STANDIN_ENTRY(n) {#n, (void *)&n},
static const struct export_entry g_exports[] = {
    STANDIN_EXPORTS(STANDIN_ENTRY)
    {"cuGetProcAddress_v2", (void *)&cuGetProcAddress_v2},
};

_Static_assert(__COUNTER__ <= STANDIN_MAX_FUNCS, "too many exported functions for g_calls");

static void *find_export(const char *name)
{
    for (size_t i = 0; i < sizeof(g_exports) / sizeof(g_exports[0]); i++)
        if (strcmp(g_exports[i].name, name) == 0)
            return g_exports[i].addr;
    return NULL;
}
