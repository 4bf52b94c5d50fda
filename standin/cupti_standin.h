/*
 * cupti_standin.h -- what cudatrace's STAND-IN libcupti (libcupti_standin.c) and the
 * STAND-IN libcuda (libcuda_standin.c) share.  NOT NVIDIA's CUPTI headers.
 *
 *  1. The hook interface: the stand-in libcupti registers hooks with the stand-in libcuda
 *     (cudatrace_standin_set_activity_hooks, looked up with dlsym(RTLD_DEFAULT)); each
 *     launch, copy and memset of the stand-in libcuda then reports its call and the "GPU
 *     work" it issued, and the stand-in libcupti turns them into activity records.
 *     (The direction is libcupti -> libcuda because libcuda is always in the global
 *     symbol scope, while libcupti is dlopen'ed RTLD_LOCAL by the injection library.)
 *  2. The CUPTI 13 activity record layouts the stand-in libcupti writes, with the real
 *     field order and sizes (x86-64), _Static_assert'ed.
 */
#ifndef CUDATRACE_CUPTI_STANDIN_H
#define CUDATRACE_CUPTI_STANDIN_H

#include <stddef.h>
#include <stdint.h>

/* ---- hook interface ------------------------------------------------------ */

enum standin_work_kind {
    STANDIN_WORK_NONE = 0, /* the call failed: no GPU work */
    STANDIN_WORK_KERNEL = 1,
    STANDIN_WORK_MEMCPY = 2,
    STANDIN_WORK_MEMSET = 3,
    STANDIN_WORK_GRAPH = 4, /* a graph launch: `nodes` ran, each its own work */
};

/* One driver call in flight, filled by api_enter. */
struct standin_api_call {
    uint32_t cbid;
    uint32_t correlation_id; /* 0: no libcupti listening */
    uint64_t start;
    /* The callback API's per-call slot (CUpti_CallbackData.correlationData). */
    uint64_t callback_data;
};

/* The GPU work a call issued. */
struct standin_gpu_work {
    uint32_t kind; /* enum standin_work_kind */
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t dynamic_shared;
    uint64_t stream; /* the CUstream handle */
    const char *name; /* kernel name, NULL if unknown */
    uint64_t bytes;
    uint32_t copy_kind; /* CUPTI memcpy kind (1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP) */
    uint32_t src_kind;  /* CUPTI memory kind (1 pageable, 3 device) */
    uint32_t dst_kind;
    uint32_t async;
    uint32_t memset_value;
    /* Kernels: when nonzero, the GPU start and end to report instead of the timing rule
     * below (set for the next launch of a thread with cudatrace_standin_next_kernel_times:
     * the stand-in libnccl's kernels that wait for the other ranks). */
    uint64_t start_ns;
    uint64_t end_ns;
    /* Work of a graph: CUPTI's graph id and graph node id (0 when not in a graph). */
    uint32_t graph_id;
    uint64_t graph_node_id;
    /* STANDIN_WORK_GRAPH: the nodes' work, in the graph's order. */
    const struct standin_gpu_work *nodes;
    uint32_t node_count;
};

/* Exported by the stand-in libcuda: the GPU start and end of the calling thread's next
 * launch (ts() clock: CLOCK_MONOTONIC under cudatrace's injection). */
typedef void (*standin_next_kernel_times_fn)(uint64_t start_ns, uint64_t end_ns);
#define STANDIN_NEXT_KERNEL_TIMES "cudatrace_standin_next_kernel_times"

struct standin_activity_hooks {
    void (*api_enter)(uint32_t cbid, struct standin_api_call *call);
    void (*api_exit)(const struct standin_api_call *call, uint32_t result,
                     const struct standin_gpu_work *work);
};

/* Exported by the stand-in libcuda. */
typedef void (*standin_set_activity_hooks_fn)(const struct standin_activity_hooks *hooks);
#define STANDIN_SET_ACTIVITY_HOOKS "cudatrace_standin_set_activity_hooks"

/* What every stand-in kernel reports (CUPTI would read them from the cubin). */
#define STANDIN_KERNEL_REGISTERS 40
#define STANDIN_KERNEL_STATIC_SHARED 512
/* CUPTI's stream id of the NULL (legacy default) stream; other streams report the low
 * 32 bits of their handle. */
#define STANDIN_DEFAULT_STREAM_ID 7
#define STANDIN_CONTEXT_ID 1
#define STANDIN_DEVICE_ID 0
/* GPU timing rule: start = API record end + STANDIN_GPU_DELAY_NS; duration = gridX *
 * gridY * gridZ ns for a kernel, bytes ns for a copy or memset. */
#define STANDIN_GPU_DELAY_NS 1000

/* CUPTI driver callback ids (cupti_driver_cbid.h) of the stand-in's hooked functions. */
#define CBID_cuMemcpyHtoD_v2 276
#define CBID_cuMemcpyHtoDAsync_v2 277
#define CBID_cuMemcpyDtoH_v2 278
#define CBID_cuMemcpyDtoHAsync_v2 279
#define CBID_cuMemcpyDtoD_v2 280
#define CBID_cuMemcpyDtoDAsync_v2 281
#define CBID_cuMemcpy2D_v2 287
#define CBID_cuMemcpy2DAsync_v2 289
#define CBID_cuMemcpy3D_v2 290
#define CBID_cuMemcpy3DAsync_v2 291
#define CBID_cuMemcpy 305
#define CBID_cuMemcpyAsync 306
#define CBID_cuLaunchKernel 307
#define CBID_cuMemcpyPeer 318
#define CBID_cuMemcpyPeerAsync 319
#define CBID_cuMemcpyHtoD_v2_ptds 397
#define CBID_cuMemcpyDtoH_v2_ptds 398
#define CBID_cuMemcpyDtoD_v2_ptds 399
#define CBID_cuMemcpy2D_v2_ptds 405
#define CBID_cuMemcpy3D_v2_ptds 407
#define CBID_cuMemcpy_ptds 408
#define CBID_cuMemcpyPeer_ptds 409
#define CBID_cuMemsetD8_v2 249
#define CBID_cuMemsetD16_v2 250
#define CBID_cuMemsetD32_v2 251
#define CBID_cuMemsetD8_v2_ptds 411
#define CBID_cuMemsetD16_v2_ptds 412
#define CBID_cuMemsetD32_v2_ptds 413
#define CBID_cuMemsetD8Async 216
#define CBID_cuMemsetD16Async 218
#define CBID_cuMemsetD32Async 220
#define CBID_cuMemcpyAsync_ptsz 418
#define CBID_cuMemcpyHtoDAsync_v2_ptsz 421
#define CBID_cuMemcpyDtoHAsync_v2_ptsz 422
#define CBID_cuMemcpyDtoDAsync_v2_ptsz 423
#define CBID_cuMemcpy2DAsync_v2_ptsz 424
#define CBID_cuMemcpy3DAsync_v2_ptsz 425
#define CBID_cuMemcpyPeerAsync_ptsz 426
#define CBID_cuMemsetD8Async_ptsz 428
#define CBID_cuMemsetD16Async_ptsz 429
#define CBID_cuMemsetD32Async_ptsz 430
#define CBID_cuLaunchKernel_ptsz 442
#define CBID_cuLaunchCooperativeKernel 477
#define CBID_cuLaunchCooperativeKernel_ptsz 478
#define CBID_cuLaunchKernelEx 652
#define CBID_cuLaunchKernelEx_ptsz 653
#define CBID_cuGraphLaunch 514
#define CBID_cuGraphLaunch_ptsz 515

/* ---- CUPTI values -------------------------------------------------------- */

#define CUPTI_SUCCESS 0
#define CUPTI_ERROR_INVALID_PARAMETER 1
#define CUPTI_ERROR_MAX_LIMIT_REACHED 12
#define CUPTI_ERROR_NOT_COMPATIBLE 14
#define CUPTI_ERROR_NOT_INITIALIZED 15
#define CUPTI_ERROR_INVALID_KIND 21
#define CUPTI_ERROR_NOT_SUPPORTED 27
#define CUPTI_ERROR_INSUFFICIENT_PRIVILEGES 35
#define CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED 39
#define CUPTI_ERROR_UNKNOWN 999

#define CUPTI_ACTIVITY_KIND_MEMCPY 1
#define CUPTI_ACTIVITY_KIND_MEMSET 2
#define CUPTI_ACTIVITY_KIND_DRIVER 4
#define CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL 10

#define CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM 1
#define CUPTI_API_VERSION_STANDIN 130001
/* What the stand-in reports with CUPTI_STANDIN_MULTI=1: CUDA 13.3, where CUPTI lets
 * several clients subscribe. */
#define CUPTI_API_VERSION_STANDIN_MULTI 130300

/* ---- CUPTI 13 record layouts (x86-64) -------------------------------------- */

typedef struct {
    uint32_t kind;
    uint8_t cacheConfig;
    uint8_t sharedMemoryConfig;
    uint16_t registersPerThread;
    uint32_t partitionedGlobalCacheRequested;
    uint32_t partitionedGlobalCacheExecuted;
    uint64_t start;
    uint64_t end;
    uint64_t completed;
    uint32_t deviceId;
    uint32_t contextId;
    uint32_t streamId;
    int32_t gridX, gridY, gridZ;
    int32_t blockX, blockY, blockZ;
    int32_t staticSharedMemory;
    int32_t dynamicSharedMemory;
    uint32_t localMemoryPerThread;
    uint32_t localMemoryTotal;
    uint32_t correlationId;
    int64_t gridId;
    const char *name;
    void *reserved0;
    uint64_t queued;
    uint64_t submitted;
    uint8_t launchType;
    uint8_t isSharedMemoryCarveoutRequested;
    uint8_t sharedMemoryCarveoutRequested;
    uint8_t padding;
    uint32_t sharedMemoryExecuted;
    uint64_t graphNodeId;
    uint32_t shmemLimitConfig;
    uint32_t graphId;
    void *pAccessPolicyWindow;
    uint32_t channelID;
    uint32_t channelType;
    uint32_t clusterX, clusterY, clusterZ;
    uint32_t clusterSchedulingPolicy;
    uint64_t localMemoryTotal_v2;
    uint32_t maxPotentialClusterSize;
    uint32_t maxActiveClusters;
    uint8_t isDeviceLaunched;
    uint8_t padding3[7];
} standin_activity_kernel10;
_Static_assert(sizeof(standin_activity_kernel10) == 216, "CUpti_ActivityKernel10 size");
_Static_assert(offsetof(standin_activity_kernel10, correlationId) == 92, "correlationId");
_Static_assert(offsetof(standin_activity_kernel10, name) == 104, "name");
_Static_assert(offsetof(standin_activity_kernel10, graphId) == 156, "graphId");

typedef struct {
    uint32_t kind;
    uint8_t copyKind;
    uint8_t srcKind;
    uint8_t dstKind;
    uint8_t flags;
    uint64_t bytes;
    uint64_t start;
    uint64_t end;
    uint32_t deviceId;
    uint32_t contextId;
    uint32_t streamId;
    uint32_t correlationId;
    uint32_t runtimeCorrelationId;
    uint32_t pad;
    void *reserved0;
    uint64_t graphNodeId;
    uint32_t graphId;
    uint32_t channelID;
    uint32_t channelType;
    uint8_t isDeviceLaunched;
    uint8_t pad2[3];
    uint64_t copyCount;
} standin_activity_memcpy6;
_Static_assert(sizeof(standin_activity_memcpy6) == 96, "CUpti_ActivityMemcpy6 size");
_Static_assert(offsetof(standin_activity_memcpy6, correlationId) == 44, "correlationId");
_Static_assert(offsetof(standin_activity_memcpy6, copyCount) == 88, "copyCount");

typedef struct {
    uint32_t kind;
    uint32_t value;
    uint64_t bytes;
    uint64_t start;
    uint64_t end;
    uint32_t deviceId;
    uint32_t contextId;
    uint32_t streamId;
    uint32_t correlationId;
    uint16_t flags;
    uint16_t memoryKind;
    uint32_t pad;
    void *reserved0;
    uint64_t graphNodeId;
    uint32_t graphId;
    uint32_t channelID;
    uint32_t channelType;
    uint8_t isDeviceLaunched;
    uint8_t pad2[3];
} standin_activity_memset4;
_Static_assert(sizeof(standin_activity_memset4) == 88, "CUpti_ActivityMemset4 size");
_Static_assert(offsetof(standin_activity_memset4, flags) == 48, "flags");

typedef struct {
    uint32_t kind;
    uint32_t cbid;
    uint64_t start;
    uint64_t end;
    uint32_t processId;
    uint32_t threadId;
    uint32_t correlationId;
    uint32_t returnValue;
} standin_activity_api;
_Static_assert(sizeof(standin_activity_api) == 40, "CUpti_ActivityAPI size");

#endif
