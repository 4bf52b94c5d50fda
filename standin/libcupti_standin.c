/*
 * libcupti_standin.c -- cudatrace's STAND-IN libcupti.so.13, for tests ONLY.
 *
 *      THIS IS NOT NVIDIA'S CUPTI.  It measures nothing.
 *
 * It exports the subset of CUPTI's activity API that cudatrace's injection library
 * (cupti-inject/) and a program's own profiler use, under the real names with the real
 * signatures, and writes activity records with CUPTI 13's real layouts (cupti_standin.h)
 * whose values the tests can predict.  The "GPU work" comes from the STAND-IN libcuda:
 * when activity is enabled, this library registers hooks with it
 * (cudatrace_standin_set_activity_hooks), and each stand-in launch, copy, memset and
 * graph launch reports its call and the work it issued.
 *
 * Build (see standin/README.md):
 *   gcc -shared -fPIC -O2 -g -Wall -Wextra -Werror -Wl,-soname,libcupti.so.13 \
 *       -o OUT/libcupti.so.13 standin/libcupti_standin.c -ldl
 * With -DCUPTI_STANDIN_NO_TIMESTAMP_CALLBACK it lacks
 * cuptiActivityRegisterTimestampCallback, like CUPTI before 12.x.
 *
 * Clients.  The process-wide functions (cuptiActivityRegisterCallbacks, Enable, ...) act
 * on one client, the "legacy" one: as in CUPTI before 13.3, whoever registers callbacks
 * last gets every record from then on, and the activity kinds are shared by everyone who
 * calls them.  A buffer already handed out stays its requester's: it is completed to the
 * callbacks that asked for it, at the next cuptiActivityFlushAll.  With CUPTI_STANDIN_MULTI=1
 * the library says it is CUDA 13.3 (version 130300) and cuptiSubscribe_v2 with
 * allowMultipleSubscribers gives a subscriber of its own (up to 3), whose _v2 functions
 * (callbacks, kinds, driver API ids, records, dropped counts) are its own: every client
 * gets every record it enabled; the process-wide timestamp callback is then refused
 * (CUPTI_ERROR_NOT_COMPATIBLE, as CUPTI's per-subscriber path refuses process-wide
 * settings).  Without it, cuptiSubscribe_v2 returns
 * CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED.  cuptiSubscribe (the callback API's, not
 * used for records here) allows one subscriber at a time (39 for a second), as CUPTI
 * before 13.3 does; cuptiFinalize forgets the legacy client, the timestamp callback and
 * that subscriber.
 *
 * Records (in the order written, one buffer per client at a time), for each client with
 * callbacks:
 *  - for each hooked driver call whose callback id it enabled (cuptiActivityEnableDriverApi,
 *    or all with the DRIVER kind, which overrides the single switches set before it; once
 *    the DRIVER kind was disabled, switching single ids on does nothing until it is enabled
 *    again, as run J1 suggested on CUPTI 13.0): an API record, start = ts() at entry, end = ts() at
 *    exit, processId = getpid(), threadId = gettid() (SYSTEM thread ids) or the low 32 bits
 *    of pthread_self(), returnValue = the CUresult, correlationId = 1, 2, 3, ... per hooked
 *    call (the same for every client);
 *  - then, if the call succeeded and the work's kind is enabled, its GPU record with the
 *    same correlation id: start = API end + 1000 ns, end = start + gridX*gridY*gridZ ns
 *    (kernels) or + bytes ns (copies, memsets); device 0, context 1, stream 7 for the
 *    NULL stream else the handle's low 32 bits; kernels have 40 registers per thread and
 *    512 bytes of static shared memory.  A kernel whose launch was preceded by
 *    cudatrace_standin_next_kernel_times(start, end) on its thread (the stand-in
 *    libnccl's, waiting for the other ranks) starts and ends then instead.  A graph
 *    launch gives one record per node, in the graph's order, each starting where the one
 *    before ended, with the graph's id and the node's id.
 *  ts() is the registered timestamp callback, else CLOCK_REALTIME in ns (CUPTI's default
 *  clock); cuptiGetTimestamp returns the same ts().
 *
 * Buffers: requested from the client's callback at its first record; handed back through
 * its completion callback when the next record does not fit, and on cuptiActivityFlushAll
 * (any flag) when they hold records, in the calling thread.
 *
 * Switches (environment, read when first needed):
 *  CUPTI_STANDIN_DROPPED=N        the first cuptiActivityGetNumDroppedRecords reports N
 *  CUPTI_STANDIN_ENABLE_ERROR=RC  cuptiActivityEnable fails with RC for every kind
 *                                 (35 = CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
 *  CUPTI_STANDIN_MULTI=1          several subscribers (CUPTI 13.3 with driver r610+)
 *  CUPTI_STANDIN_SWITCHES_NEED_DRIVER_KIND=1
 *                                 cuptiActivityEnableDriverApi does nothing for a client
 *                                 that never enabled the DRIVER kind: what a late attach
 *                                 saw on CUPTI 13.0 set up in a running PyTorch or JAX
 *                                 process (kernels, no API record), as a hypothesis of why
 *  CUPTI_STANDIN_DRIVER_RECORD_EVERY=N
 *                                 a DRIVER activity record comes for one hooked call in N
 *                                 (correlation ids 1, N+1, 2N+1, ...); the others' GPU
 *                                 records keep their correlation ids, and the callback API
 *                                 still sees every call: what CUPTI 13.0 did when set up in
 *                                 a running PyTorch process (run T: a kernel launched
 *                                 through libcudart got the runtime call's correlation id,
 *                                 and no driver record; the driver callback carried that id)
 *  CUPTI_STANDIN_NO_DRIVER_AFTER_DISABLE=1
 *                                 once a client disabled the DRIVER kind, no API record
 *                                 comes again for that client (kernels, copies and memsets
 *                                 still do): what run J saw on CUPTI 13.0 after
 *                                 torch.profiler let go
 *
 * The callback API: cuptiSubscribe keeps its callback and userdata; cuptiEnableCallback and
 * cuptiEnableDomain switch the driver domain's (1) callback ids; each hooked call whose id is
 * on is called back at entry (site 0) and exit (site 1), on the calling thread, with a
 * CUpti_CallbackData whose correlationId is the call's, correlationData a slot kept from
 * entry to exit, and functionReturnValue the CUresult (at exit).
 *
 * For test programs: cudatrace_standin_cupti_recording(cbid) says how many clients have
 * callbacks, kernel activity and the API records of `cbid` enabled, the callback
 * subscriber counting as one when `cbid`'s callback is on (what CUPTI itself would not
 * tell).
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
typedef void (*buffer_requested_v2_fn)(uint8_t **buffer, size_t *size, size_t *max_records,
                                       void *info);
typedef void (*buffer_completed_v2_fn)(uint8_t *buffer, size_t size, size_t valid_size,
                                       void *info);
typedef uint64_t (*timestamp_fn)(void);

/* CUpti_SubscriberParams (CUPTI 13.2+). */
typedef struct {
    size_t structSize;
    const char *subscriberName;
    char *oldSubscriberName;
    size_t oldSubscriberSize;
    uint8_t allowMultipleSubscribers;
} subscriber_params;

const char cudatrace_standin_libcupti[] __attribute__((visibility("default"))) =
    "cudatrace stand-in libcupti (not NVIDIA's CUPTI)";

#define MAX_CLIENTS 4 /* the legacy client, then up to 3 subscribers */
#define MAX_ORPHANS 8

struct client {
    int in_use;
    buffer_requested_fn requested;
    buffer_completed_fn completed;
    buffer_requested_v2_fn requested2;
    buffer_completed_v2_fn completed2;
    int kernel_on, memcpy_on, memset_on;
    /* The driver API records: one switch per callback id (the DRIVER kind sets them all). */
    unsigned char driver_cbid[1024];
    /* The DRIVER kind was disabled: switching single ids on does nothing until it is
     * enabled again (as run J1 suggested on CUPTI 13.0). */
    int driver_locked;
    /* CUPTI_STANDIN_NO_DRIVER_AFTER_DISABLE: the DRIVER kind was disabled, and no API
     * record comes again for this client. */
    int driver_gone;
    /* The DRIVER kind was enabled at least once (CUPTI_STANDIN_SWITCHES_NEED_DRIVER_KIND). */
    int driver_kind_seen;
    uint8_t *buffer;
    size_t buffer_size, buffer_used;
    size_t dropped;
};

/* Where a buffer goes back: the completion callback of the client that asked for it. */
struct owner {
    buffer_completed_fn completed;
    buffer_completed_v2_fn completed2;
};

/* A buffer handed back (full), or whose requester registered other callbacks since
 * (completed to it at the next flush). */
struct orphan {
    struct owner owner;
    uint8_t *buffer;
    size_t size, used;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct client g_clients[MAX_CLIENTS];
static struct orphan g_orphans[MAX_ORPHANS];
static int g_orphan_count;
static timestamp_fn g_timestamp;
static uint32_t g_thread_id_type;
static uint32_t g_correlation;
static int g_dropped_reported;
static int g_callback_subscribed;

/* The callback API's subscriber: its function, its userdata, its driver callback ids. */
typedef void (*api_callback_fn)(void *userdata, uint32_t domain, uint32_t cbid,
                                const void *data);
static api_callback_fn g_cb_fn;
static void *g_cb_user;
static unsigned char g_cb_driver[1024];

/* CUpti_CallbackData. */
typedef struct {
    uint32_t callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    CUcontext context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} callback_data;

/* Calls the subscriber's callback for a driver call, if its id is on (outside the lock). */
static void call_back(uint32_t site, struct standin_api_call *call, uint32_t *result)
{
    pthread_mutex_lock(&g_lock);
    api_callback_fn fn = g_cb_fn;
    void *user = g_cb_user;
    int on = fn != NULL && call->cbid < sizeof(g_cb_driver) && g_cb_driver[call->cbid];
    pthread_mutex_unlock(&g_lock);
    if (!on)
        return;
    callback_data data;
    memset(&data, 0, sizeof(data));
    data.callbackSite = site;
    data.functionReturnValue = result;
    data.correlationData = &call->callback_data;
    data.correlationId = call->correlation_id;
    fn(user, 1, call->cbid, &data);
}

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

static int multi(void)
{
    return env_long("CUPTI_STANDIN_MULTI", 0) == 1;
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

static int has_callbacks(const struct client *c)
{
    return c->requested != NULL || c->requested2 != NULL;
}

/* Hands a buffer back to its owner, outside the lock. */
static void complete(const struct owner *owner, uint8_t *buffer, size_t size, size_t used)
{
    if (buffer == NULL)
        return;
    if (owner->completed2 != NULL)
        owner->completed2(buffer, size, used, NULL);
    else if (owner->completed != NULL)
        owner->completed(NULL, 0, buffer, size, used);
}

static struct owner owner_of(const struct client *c)
{
    struct owner owner = {c->completed, c->completed2};
    return owner;
}

/* Appends one record to client c's buffer (under the lock); a full buffer is handed back
 * to `full` for the caller to complete outside the lock. */
static void append(struct client *c, const void *record, size_t size, struct orphan *full)
{
    if (c->buffer != NULL && c->buffer_used + size > c->buffer_size) {
        full->owner = owner_of(c);
        full->buffer = c->buffer;
        full->size = c->buffer_size;
        full->used = c->buffer_used;
        c->buffer = NULL;
    }
    if (c->buffer == NULL && has_callbacks(c)) {
        size_t max_records = 0;
        if (c->requested2 != NULL)
            c->requested2(&c->buffer, &c->buffer_size, &max_records, NULL);
        else
            c->requested(&c->buffer, &c->buffer_size, &max_records);
        c->buffer_used = 0;
        if (c->buffer != NULL && c->buffer_size < size)
            c->buffer = NULL;
    }
    if (c->buffer == NULL)
        c->dropped++;
    else {
        memcpy(c->buffer + c->buffer_used, record, size);
        c->buffer_used += size;
    }
}

static void api_enter(uint32_t cbid, struct standin_api_call *call)
{
    call->cbid = cbid;
    call->correlation_id = __atomic_add_fetch(&g_correlation, 1, __ATOMIC_RELAXED);
    call->start = ts();
    call_back(0, call, NULL);
}

static uint32_t stream_id(uint64_t stream)
{
    return stream == 0 ? STANDIN_DEFAULT_STREAM_ID : (uint32_t)stream;
}

/* The GPU record of one piece of work, starting at `start`; its end, or `start` if the
 * client did not enable its kind. */
static uint64_t work_record(struct client *c, const struct standin_api_call *call,
                            const struct standin_gpu_work *work, uint64_t start,
                            struct orphan *full)
{
    if (work->kind == STANDIN_WORK_KERNEL) {
        if (work->start_ns != 0)
            start = work->start_ns;
        uint64_t end = start + (uint64_t)work->grid[0] * work->grid[1] * work->grid[2];
        if (work->end_ns > start)
            end = work->end_ns;
        if (!c->kernel_on)
            return end;
        standin_activity_kernel10 k;
        memset(&k, 0, sizeof(k));
        k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
        k.registersPerThread = STANDIN_KERNEL_REGISTERS;
        k.start = start;
        k.end = end;
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
        k.graphId = work->graph_id;
        k.graphNodeId = work->graph_node_id;
        append(c, &k, sizeof(k), full);
        return end;
    }
    uint64_t end = start + work->bytes;
    if (work->kind == STANDIN_WORK_MEMCPY && c->memcpy_on) {
        standin_activity_memcpy6 m;
        memset(&m, 0, sizeof(m));
        m.kind = CUPTI_ACTIVITY_KIND_MEMCPY;
        m.copyKind = (uint8_t)work->copy_kind;
        m.srcKind = (uint8_t)work->src_kind;
        m.dstKind = (uint8_t)work->dst_kind;
        m.flags = work->async ? 1 : 0;
        m.bytes = work->bytes;
        m.start = start;
        m.end = end;
        m.deviceId = STANDIN_DEVICE_ID;
        m.contextId = STANDIN_CONTEXT_ID;
        m.streamId = stream_id(work->stream);
        m.correlationId = call->correlation_id;
        m.graphId = work->graph_id;
        m.graphNodeId = work->graph_node_id;
        m.copyCount = 1;
        append(c, &m, sizeof(m), full);
    } else if (work->kind == STANDIN_WORK_MEMSET && c->memset_on) {
        standin_activity_memset4 s;
        memset(&s, 0, sizeof(s));
        s.kind = CUPTI_ACTIVITY_KIND_MEMSET;
        s.value = work->memset_value;
        s.bytes = work->bytes;
        s.start = start;
        s.end = end;
        s.deviceId = STANDIN_DEVICE_ID;
        s.contextId = STANDIN_CONTEXT_ID;
        s.streamId = stream_id(work->stream);
        s.correlationId = call->correlation_id;
        s.flags = work->async ? 1 : 0;
        s.memoryKind = (uint16_t)work->dst_kind;
        s.graphId = work->graph_id;
        s.graphNodeId = work->graph_node_id;
        append(c, &s, sizeof(s), full);
    }
    return end;
}

static void api_exit(const struct standin_api_call *call, uint32_t result,
                     const struct standin_gpu_work *work)
{
    uint64_t end = ts();
    /* The call is the libcuda's own (not const there): the slot is written at entry. */
    call_back(1, (struct standin_api_call *)call, &result);
    long every = env_long("CUPTI_STANDIN_DRIVER_RECORD_EVERY", 1);
    int driver_record = every <= 1 || (call->correlation_id - 1) % (uint32_t)every == 0;
    struct orphan full[MAX_CLIENTS];
    memset(full, 0, sizeof(full));
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < MAX_CLIENTS; i++) {
        struct client *c = &g_clients[i];
        if (!has_callbacks(c))
            continue;
        if (driver_record && !c->driver_gone && call->cbid < sizeof(c->driver_cbid) &&
            c->driver_cbid[call->cbid]) {
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
            append(c, &api, sizeof(api), &full[i]);
        }
        if (result != 0 || work == NULL)
            continue;
        uint64_t start = end + STANDIN_GPU_DELAY_NS;
        if (work->kind == STANDIN_WORK_GRAPH) {
            for (uint32_t n = 0; n < work->node_count; n++)
                start = work_record(c, call, &work->nodes[n], start, &full[i]);
        } else {
            work_record(c, call, work, start, &full[i]);
        }
    }
    pthread_mutex_unlock(&g_lock);
    for (int i = 0; i < MAX_CLIENTS; i++)
        complete(&full[i].owner, full[i].buffer, full[i].size, full[i].used);
}

static const struct standin_activity_hooks g_hooks = {api_enter, api_exit};

/* Tells the stand-in libcuda to report its calls here. */
static CUptiResult hook_libcuda(void)
{
    standin_set_activity_hooks_fn set =
        (standin_set_activity_hooks_fn)dlsym(RTLD_DEFAULT, STANDIN_SET_ACTIVITY_HOOKS);
    if (set == NULL) {
        /* A libcuda loaded with RTLD_LOCAL (Python's ctypes.CDLL): found by its soname, as
         * CUPTI finds the driver the process loaded. */
        void *libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
        if (libcuda != NULL)
            set = (standin_set_activity_hooks_fn)dlsym(libcuda, STANDIN_SET_ACTIVITY_HOOKS);
    }
    if (set == NULL)
        return CUPTI_ERROR_NOT_INITIALIZED; /* not the stand-in libcuda */
    set(&g_hooks);
    return CUPTI_SUCCESS;
}

/* The client a subscriber handle names (handles are 1-based slots), NULL if none. */
static struct client *subscriber(void *handle)
{
    uintptr_t slot = (uintptr_t)handle;
    if (slot == 0 || slot >= MAX_CLIENTS || !g_clients[slot].in_use)
        return NULL;
    return &g_clients[slot];
}

#include "libcupti_standin_api.h"
