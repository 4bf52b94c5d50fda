/*
 * libcupti_standin.c -- cudatrace's STAND-IN libcupti.so.13, for tests ONLY.
 *
 *      THIS IS NOT NVIDIA'S CUPTI.  It measures nothing.
 *
 * It exports the subset of CUPTI's activity API that cudatrace's injection library
 * (cupti-inject/) uses, under the real names with the real signatures, and writes
 * activity records with CUPTI 13's real layouts (cupti_standin.h) whose values the tests
 * can predict.  The "GPU work" comes from the STAND-IN libcuda: when activity is enabled,
 * this library registers hooks with it (cudatrace_standin_set_activity_hooks), and each
 * stand-in launch, copy and memset reports its call and the work it issued.
 *
 * Build (see standin/README.md):
 *   gcc -shared -fPIC -O2 -g -Wall -Wextra -Werror -Wl,-soname,libcupti.so.13 \
 *       -o OUT/libcupti.so.13 standin/libcupti_standin.c -ldl
 * With -DCUPTI_STANDIN_NO_TIMESTAMP_CALLBACK it lacks
 * cuptiActivityRegisterTimestampCallback, like CUPTI before 12.x.
 *
 * Records (in the order written, one buffer at a time):
 *  - for each hooked driver call whose callback id was enabled with
 *    cuptiActivityEnableDriverApi (or all, with the DRIVER kind): an API record,
 *      start = ts() at entry, end = ts() at exit, processId = getpid(),
 *      threadId = gettid() (SYSTEM thread ids) or the low 32 bits of pthread_self(),
 *      returnValue = the CUresult, correlationId = 1, 2, 3, ... per hooked call;
 *  - then, if the call succeeded and its kind is enabled, its GPU record with the same
 *    correlation id: start = API end + 1000 ns, end = start + gridX*gridY*gridZ ns
 *    (kernels) or + bytes ns (copies, memsets); device 0, context 1, stream 7 for the
 *    NULL stream else the handle's low 32 bits; kernels have 40 registers per thread
 *    and 512 bytes of static shared memory.  A kernel whose launch was preceded by
 *    cudatrace_standin_next_kernel_times(start, end) on its thread (the stand-in
 *    libnccl's, waiting for the other ranks) starts and ends then instead.
 *  ts() is the registered timestamp callback, else CLOCK_REALTIME in ns (CUPTI's default
 *  clock); cuptiGetTimestamp returns the same ts().
 *
 * Buffers: requested from the client's callback at the first record; handed back through
 * the completion callback when the next record does not fit, and on cuptiActivityFlushAll
 * (any flag) when they hold records, in the calling thread.
 *
 * Switches (environment, read when first needed):
 *  CUPTI_STANDIN_DROPPED=N        the first cuptiActivityGetNumDroppedRecords reports N
 *  CUPTI_STANDIN_ENABLE_ERROR=RC  cuptiActivityEnable fails with RC for every kind
 *                                 (35 = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "cupti_standin.h"

#define EXPORT __attribute__((visibility("default")))

typedef uint32_t CUptiResult;
typedef void *CUcontext;
typedef struct {
    uint32_t kind;
} CUpti_Activity;
typedef void (*buffer_requested_fn)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*buffer_completed_fn)(CUcontext ctx, uint32_t stream_id, uint8_t *buffer,
                                    size_t size, size_t valid_size);
typedef uint64_t (*timestamp_fn)(void);

const char cudatrace_standin_libcupti[] __attribute__((visibility("default"))) =
    "cudatrace stand-in libcupti (not NVIDIA's CUPTI)";

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static buffer_requested_fn g_requested;
static buffer_completed_fn g_completed;
static timestamp_fn g_timestamp;
static uint32_t g_thread_id_type;
static int g_kernel_on, g_memcpy_on, g_memset_on, g_driver_all;
static unsigned char g_driver_cbid[1024];
static uint32_t g_correlation;
/* The buffer being filled. */
static uint8_t *g_buffer;
static size_t g_buffer_size, g_buffer_used;
static size_t g_dropped;
static int g_dropped_reported;

static uint64_t ts(void)
{
    timestamp_fn callback = __atomic_load_n(&g_timestamp, __ATOMIC_ACQUIRE);
    if (callback != NULL)
        return callback();
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

static long env_long(const char *name, long fallback)
{
    const char *value = getenv(name);
    if (value == NULL || *value == '\0')
        return fallback;
    return strtol(value, NULL, 10);
}

static size_t record_size(uint32_t kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        return sizeof(standin_activity_kernel10);
    case CUPTI_ACTIVITY_KIND_MEMCPY:
        return sizeof(standin_activity_memcpy6);
    case CUPTI_ACTIVITY_KIND_MEMSET:
        return sizeof(standin_activity_memset4);
    case CUPTI_ACTIVITY_KIND_DRIVER:
        return sizeof(standin_activity_api);
    default:
        return 0;
    }
}

/* Hands the current buffer back to the client, outside the lock. */
static void complete(uint8_t *buffer, size_t size, size_t used)
{
    if (buffer != NULL && g_completed != NULL)
        g_completed(NULL, 0, buffer, size, used);
}

/* Appends one record; hands a full buffer back first. */
static void append(const void *record, size_t size)
{
    uint8_t *full = NULL;
    size_t full_size = 0, full_used = 0;
    pthread_mutex_lock(&g_lock);
    if (g_buffer != NULL && g_buffer_used + size > g_buffer_size) {
        full = g_buffer;
        full_size = g_buffer_size;
        full_used = g_buffer_used;
        g_buffer = NULL;
    }
    if (g_buffer == NULL && g_requested != NULL) {
        size_t max_records = 0;
        g_requested(&g_buffer, &g_buffer_size, &max_records);
        g_buffer_used = 0;
        if (g_buffer != NULL && g_buffer_size < size)
            g_buffer = NULL;
    }
    if (g_buffer == NULL)
        g_dropped++;
    else {
        memcpy(g_buffer + g_buffer_used, record, size);
        g_buffer_used += size;
    }
    pthread_mutex_unlock(&g_lock);
    complete(full, full_size, full_used);
}

static void api_enter(uint32_t cbid, struct standin_api_call *call)
{
    call->cbid = cbid;
    call->correlation_id = __atomic_add_fetch(&g_correlation, 1, __ATOMIC_RELAXED);
    call->start = ts();
}

static uint32_t stream_id(uint64_t stream)
{
    return stream == 0 ? STANDIN_DEFAULT_STREAM_ID : (uint32_t)stream;
}

static void api_exit(const struct standin_api_call *call, uint32_t result,
                     const struct standin_gpu_work *work)
{
    uint64_t end = ts();
    if (g_driver_all || (call->cbid < sizeof(g_driver_cbid) && g_driver_cbid[call->cbid])) {
        standin_activity_api api;
        memset(&api, 0, sizeof(api));
        api.kind = CUPTI_ACTIVITY_KIND_DRIVER;
        api.cbid = call->cbid;
        api.start = call->start;
        api.end = end;
        api.processId = (uint32_t)getpid();
        api.threadId = g_thread_id_type == CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM
                           ? (uint32_t)syscall(SYS_gettid)
                           : (uint32_t)pthread_self();
        api.correlationId = call->correlation_id;
        api.returnValue = result;
        append(&api, sizeof(api));
    }
    if (result != 0 || work == NULL)
        return;
    uint64_t start = end + STANDIN_GPU_DELAY_NS;
    if (work->kind == STANDIN_WORK_KERNEL && g_kernel_on) {
        standin_activity_kernel10 k;
        memset(&k, 0, sizeof(k));
        k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k.registersPerThread = STANDIN_KERNEL_REGISTERS;
        k.start = work->start_ns != 0 ? work->start_ns : start;
        k.end = k.start + (uint64_t)work->grid[0] * work->grid[1] * work->grid[2];
        if (work->end_ns > k.start)
            k.end = work->end_ns;
        k.completed = k.end;
        k.deviceId = STANDIN_DEVICE_ID;
        k.contextId = STANDIN_CONTEXT_ID;
        k.streamId = stream_id(work->stream);
        k.gridX = (int32_t)work->grid[0];
        k.gridY = (int32_t)work->grid[1];
        k.gridZ = (int32_t)work->grid[2];
        k.blockX = (int32_t)work->block[0];
        k.blockY = (int32_t)work->block[1];
        k.blockZ = (int32_t)work->block[2];
        k.staticSharedMemory = STANDIN_KERNEL_STATIC_SHARED;
        k.dynamicSharedMemory = (int32_t)work->dynamic_shared;
        k.correlationId = call->correlation_id;
        k.name = work->name;
        append(&k, sizeof(k));
    } else if (work->kind == STANDIN_WORK_MEMCPY && g_memcpy_on) {
        standin_activity_memcpy6 m;
        memset(&m, 0, sizeof(m));
        m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
        m.copyKind = (uint8_t)work->copy_kind;
        m.srcKind = (uint8_t)work->src_kind;
        m.dstKind = (uint8_t)work->dst_kind;
        m.flags = work->async ? 1 : 0;
        m.bytes = work->bytes;
        m.start = start;
        m.end = start + work->bytes;
        m.deviceId = STANDIN_DEVICE_ID;
        m.contextId = STANDIN_CONTEXT_ID;
        m.streamId = stream_id(work->stream);
        m.correlationId = call->correlation_id;
        m.copyCount = 1;
        append(&m, sizeof(m));
    } else if (work->kind == STANDIN_WORK_MEMSET && g_memset_on) {
        standin_activity_memset4 s;
        memset(&s, 0, sizeof(s));
        s.kind = CUPTI_ACTIVITY_KIND_MEMSET;
        s.value = work->memset_value;
        s.bytes = work->bytes;
        s.start = start;
        s.end = start + work->bytes;
        s.deviceId = STANDIN_DEVICE_ID;
        s.contextId = STANDIN_CONTEXT_ID;
        s.streamId = stream_id(work->stream);
        s.correlationId = call->correlation_id;
        s.flags = work->async ? 1 : 0;
        s.memoryKind = (uint16_t)work->dst_kind;
        append(&s, sizeof(s));
    }
}

static const struct standin_activity_hooks g_hooks = {api_enter, api_exit};

/* Tells the stand-in libcuda to report its calls here. */
static CUptiResult hook_libcuda(void)
{
    standin_set_activity_hooks_fn set =
        (standin_set_activity_hooks_fn)dlsym(RTLD_DEFAULT, STANDIN_SET_ACTIVITY_HOOKS);
    if (set == NULL)
        return CUPTI_ERROR_NOT_INITIALIZED; /* not the stand-in libcuda */
    set(&g_hooks);
    return CUPTI_SUCCESS;
}

/* ==== exported CUPTI functions ============================================ */

EXPORT CUptiResult cuptiGetVersion(uint32_t *version)
{
    if (version == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *version = CUPTI_API_VERSION_STANDIN;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetResultString(CUptiResult result, const char **str)
{
    if (str == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    switch (result) {
    case CUPTI_SUCCESS: *str = "CUPTI_SUCCESS"; break;
    case CUPTI_ERROR_INVALID_PARAMETER: *str = "CUPTI_ERROR_INVALID_PARAMETER"; break;
    case CUPTI_ERROR_MAX_LIMIT_REACHED: *str = "CUPTI_ERROR_MAX_LIMIT_REACHED"; break;
    case CUPTI_ERROR_NOT_INITIALIZED: *str = "CUPTI_ERROR_NOT_INITIALIZED"; break;
    case CUPTI_ERROR_INVALID_KIND: *str = "CUPTI_ERROR_INVALID_KIND"; break;
    case CUPTI_ERROR_NOT_SUPPORTED: *str = "CUPTI_ERROR_NOT_SUPPORTED"; break;
    case CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: *str = "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"; break;
    case CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        *str = "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED";
        break;
    default: *str = "CUPTI_ERROR_UNKNOWN"; return CUPTI_ERROR_INVALID_PARAMETER;
    }
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiGetTimestamp(uint64_t *timestamp)
{
    if (timestamp == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *timestamp = ts();
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiSetThreadIdType(uint32_t type)
{
    if (type > CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM)
        return CUPTI_ERROR_INVALID_PARAMETER;
    g_thread_id_type = type;
    return CUPTI_SUCCESS;
}

#ifndef CUPTI_STANDIN_NO_TIMESTAMP_CALLBACK
EXPORT CUptiResult cuptiActivityRegisterTimestampCallback(timestamp_fn callback)
{
    if (callback == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    __atomic_store_n(&g_timestamp, callback, __ATOMIC_RELEASE);
    return CUPTI_SUCCESS;
}
#endif

EXPORT CUptiResult cuptiActivityRegisterCallbacks(buffer_requested_fn requested,
                                                  buffer_completed_fn completed)
{
    if (requested == NULL || completed == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    g_requested = requested;
    g_completed = completed;
    pthread_mutex_unlock(&g_lock);
    return CUPTI_SUCCESS;
}

static int *kind_switch(uint32_t kind)
{
    switch (kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return &g_kernel_on;
    case CUPTI_ACTIVITY_KIND_MEMCPY: return &g_memcpy_on;
    case CUPTI_ACTIVITY_KIND_MEMSET: return &g_memset_on;
    case CUPTI_ACTIVITY_KIND_DRIVER: return &g_driver_all;
    default: return NULL;
    }
}

EXPORT CUptiResult cuptiActivityEnable(uint32_t kind)
{
    long forced = env_long("CUPTI_STANDIN_ENABLE_ERROR", 0);
    if (forced != 0)
        return (CUptiResult)forced;
    int *on = kind_switch(kind);
    if (on == NULL)
        return CUPTI_ERROR_NOT_SUPPORTED;
    CUptiResult rc = hook_libcuda();
    if (rc != CUPTI_SUCCESS)
        return rc;
    *on = 1;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityDisable(uint32_t kind)
{
    int *on = kind_switch(kind);
    if (on == NULL)
        return CUPTI_ERROR_NOT_SUPPORTED;
    *on = 0;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityEnableDriverApi(uint32_t cbid, uint8_t enable)
{
    if (cbid >= sizeof(g_driver_cbid))
        return CUPTI_ERROR_INVALID_PARAMETER;
    CUptiResult rc = hook_libcuda();
    if (rc != CUPTI_SUCCESS)
        return rc;
    g_driver_cbid[cbid] = enable ? 1 : 0;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    (void)flag;
    if (g_completed == NULL)
        return CUPTI_ERROR_NOT_INITIALIZED;
    uint8_t *buffer = NULL;
    size_t size = 0, used = 0;
    pthread_mutex_lock(&g_lock);
    if (g_buffer != NULL && g_buffer_used > 0) {
        buffer = g_buffer;
        size = g_buffer_size;
        used = g_buffer_used;
        g_buffer = NULL;
    }
    pthread_mutex_unlock(&g_lock);
    complete(buffer, size, used);
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid,
                                              CUpti_Activity **record)
{
    if (buffer == NULL || record == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    uint8_t *next;
    if (*record == NULL) {
        next = buffer;
    } else {
        size_t size = record_size((*record)->kind);
        if (size == 0)
            return CUPTI_ERROR_INVALID_KIND;
        next = (uint8_t *)*record + size;
    }
    if (next + sizeof(uint32_t) > buffer + valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    size_t size = record_size(((CUpti_Activity *)next)->kind);
    if (size == 0 || next + size > buffer + valid)
        return CUPTI_ERROR_INVALID_KIND;
    *record = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

EXPORT CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream_id,
                                                     size_t *dropped)
{
    (void)context;
    (void)stream_id;
    if (dropped == NULL)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&g_lock);
    size_t count = g_dropped;
    g_dropped = 0;
    if (!g_dropped_reported) {
        g_dropped_reported = 1;
        count += (size_t)env_long("CUPTI_STANDIN_DROPPED", 0);
    }
    pthread_mutex_unlock(&g_lock);
    *dropped = count;
    return CUPTI_SUCCESS;
}
