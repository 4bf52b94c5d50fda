/*
 * libnccl_standin.c -- cudatrace's STAND-IN libnccl.so.2, for tests ONLY.
 *
 *      THIS IS NOT NVIDIA'S NCCL.  It does no communication and no GPU work.
 *
 * It exports the NCCL functions cudatrace probes under their real names with their
 * real signatures (nccl.h of NCCL 2.28, x86-64 SysV: same argument order and widths;
 * the 128-byte ncclUniqueId passed by value), each also as its profiling alias
 * pnccl* at the SAME address, as NCCL 2.28 exports them.  Every function checks a few
 * arguments the way NCCL does, fills its outputs with deterministic values and
 * returns.  No sleeping, no printing (but in the rendezvous below, which tests ask for).
 *
 * Build (see standin/README.md):
 *   gcc -shared -fPIC -O2 -fno-ipa-icf -g -Wall -Wextra -Werror \
 *       -Wl,-soname,libnccl.so.2 -o OUT/libnccl.so.2 standin/libnccl_standin.c
 *
 * -fno-ipa-icf: functions with identical bodies (ncclGather, ncclScatter) must stay
 * functions of their own, at addresses of their own.
 *
 * The marker `cudatrace_standin_libnccl` lets the tracer tell the stand-in from NCCL.
 *
 * Deterministic values:
 *  - Communicators (ncclCommInitRank*, ncclCommInitAll, ncclCommSplit, ncclCommShrink)
 *    are 0x2000 + 0x10 * n, n counting communicators made in the process, in call
 *    order; ncclCommInitAll makes ndev of them, comms[i] being rank i of ndev, on
 *    device devlist[i] (or i without a devlist).  ncclCommInitRank* record the rank,
 *    nranks and device 0 (so ncclCommCuDevice gives 0); a split child has rank 0 of 1.
 *    At most 64 communicators per process; more give ncclInternalError (3).
 *  - ncclGetVersion reports 22809 (2.28.9); ncclMemAlloc returns 0x7e0000000000 plus
 *    the sizes allocated before it.
 *  - ncclBcast(buff, ...) calls ncclBroadcast(buff, buff, ...), as NCCL's does.
 *
 * Rendezvous (NCCL_STANDIN_RENDEZVOUS=DIR, for the cross-rank tests): the ranks of a
 * communicator made by ncclCommInitRank* (in separate processes, one per rank) meet at
 * each of its ncclAllReduce calls, as NCCL's kernels do.  Rank r of the n-th all-reduce
 * (n from 1) writes its arrival time A_r (CLOCK_MONOTONIC ns, at entry) to
 * DIR/ID-n.r (ID: the unique id's first 8 bytes as 16 hex digits), waits until every
 * rank's file of n exists (polling every 50 us; after 60 s it gives up and launches
 * nothing), then, when a stand-in libcuda is in the global scope, launches one kernel
 * named ncclDevKernel_AllReduce_Sum_f32_RING_LL on the call's stream, with its GPU times
 * set (cudatrace_standin_next_kernel_times) to start = A_r + 1000 and end =
 * max_r(A_r) + 1000 + NCCL_STANDIN_TRANSFER_NS (default 100000): every rank's kernel
 * starts when its rank arrives and ends at the same instant, the last arrival plus the
 * transfer; the call returns then (as if its caller synchronised the stream).  Its first
 * use loads a module and gets the function (cuModuleLoadData, cuModuleGetFunction),
 * inside that all-reduce.
 * Errors that mirror NCCL:
 *  - NULL output pointer, NULL or unknown comm         -> ncclInvalidArgument (4)
 *  - nranks < 1, rank outside [0, nranks)               -> ncclInvalidArgument (4)
 *  - datatype >= 12, op outside [0, 5)                  -> ncclInvalidArgument (4)
 *  - root or peer outside [0, nranks)                   -> ncclInvalidArgument (4)
 *  - ncclGroupEnd without ncclGroupStart                -> ncclInvalidUsage (5)
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cupti_standin.h"

#define EXPORT __attribute__((visibility("default")))
/* The profiling alias: the same function at the same address. */
#define ALIAS(name) extern __typeof__(name) p##name __attribute__((alias(#name))) EXPORT;

EXPORT const char cudatrace_standin_libnccl[] =
    "cudatrace stand-in libnccl (not NVIDIA's NCCL)";

typedef enum {
    ncclSuccess = 0,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
} ncclResult_t;

typedef struct ncclComm *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
_Static_assert(sizeof(ncclUniqueId) == 128, "ncclUniqueId is 128 bytes");
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;
typedef struct ncclConfig ncclConfig_t;

#define MAX_COMMS 64
#define FIRST_COMM 0x2000u
#define NUM_TYPES 12
#define NUM_OPS 5

struct comm_info {
    int rank, nranks, device;
    /* ncclCommInitRank*: the unique id's first 8 bytes (as hex, big-endian), for the
     * rendezvous; the all-reduces made so far. */
    int has_id;
    uint64_t id;
    unsigned long long all_reduces;
};
static struct comm_info comms[MAX_COMMS];
static unsigned made;
static int group_depth;
static uint64_t mem_cursor = 0x7e0000000000ull;

static ncclResult_t new_comm(ncclComm_t *out, int rank, int nranks, int device)
{
    if (made >= MAX_COMMS)
        return ncclInternalError;
    comms[made] = (struct comm_info){ rank, nranks, device, 0, 0, 0 };
    *out = (ncclComm_t)(uintptr_t)(FIRST_COMM + 0x10u * made);
    made++;
    return ncclSuccess;
}

static struct comm_info *info(ncclComm_t comm)
{
    uintptr_t handle = (uintptr_t)comm;
    if (handle < FIRST_COMM || (handle - FIRST_COMM) % 0x10 != 0)
        return NULL;
    uintptr_t index = (handle - FIRST_COMM) / 0x10;
    return index < made ? &comms[index] : NULL;
}

EXPORT ncclResult_t ncclGetVersion(int *version)
{
    if (version == NULL)
        return ncclInvalidArgument;
    *version = 22809;
    return ncclSuccess;
}
ALIAS(ncclGetVersion)

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    if (comm == NULL || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    ncclResult_t rc = new_comm(comm, rank, nranks, 0);
    if (rc == ncclSuccess) {
        struct comm_info *c = &comms[made - 1];
        c->has_id = 1;
        for (int i = 0; i < 8; i++)
            c->id = c->id << 8 | (uint8_t)commId.internal[i];
    }
    return rc;
}
ALIAS(ncclCommInitRank)

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                           int rank, ncclConfig_t *config)
{
    (void)config;
    return ncclCommInitRank(comm, nranks, commId, rank);
}
ALIAS(ncclCommInitRankConfig)

EXPORT ncclResult_t ncclCommInitRankScalable(ncclComm_t *comm, int nranks, int myrank, int nId,
                                             ncclUniqueId *commIds, ncclConfig_t *config)
{
    (void)config;
    if (comm == NULL || commIds == NULL || nId < 1 || nranks < 1 || myrank < 0 ||
        myrank >= nranks)
        return ncclInvalidArgument;
    return new_comm(comm, myrank, nranks, 0);
}
ALIAS(ncclCommInitRankScalable)

EXPORT ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    if (comm == NULL || ndev < 1)
        return ncclInvalidArgument;
    for (int i = 0; i < ndev; i++) {
        ncclResult_t rc = new_comm(&comm[i], i, ndev, devlist ? devlist[i] : i);
        if (rc != ncclSuccess)
            return rc;
    }
    return ncclSuccess;
}
ALIAS(ncclCommInitAll)

EXPORT ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                  ncclConfig_t *config)
{
    (void)color;
    (void)key;
    (void)config;
    struct comm_info *parent = info(comm);
    if (parent == NULL || newcomm == NULL)
        return ncclInvalidArgument;
    return new_comm(newcomm, 0, 1, parent->device);
}
ALIAS(ncclCommSplit)

EXPORT ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                                   ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    (void)excludeRanksList;
    (void)config;
    (void)shrinkFlags;
    struct comm_info *parent = info(comm);
    if (parent == NULL || newcomm == NULL || excludeRanksCount < 0 ||
        excludeRanksCount >= parent->nranks)
        return ncclInvalidArgument;
    return new_comm(newcomm, 0, parent->nranks - excludeRanksCount, parent->device);
}
ALIAS(ncclCommShrink)

static ncclResult_t comm_only(ncclComm_t comm)
{
    return info(comm) ? ncclSuccess : ncclInvalidArgument;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm_only(comm); }
ALIAS(ncclCommFinalize)
EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) { return comm_only(comm); }
ALIAS(ncclCommDestroy)
EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) { return comm_only(comm); }
ALIAS(ncclCommAbort)

EXPORT ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    struct comm_info *c = info(comm);
    if (c == NULL || count == NULL)
        return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}
ALIAS(ncclCommCount)

EXPORT ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    struct comm_info *c = info(comm);
    if (c == NULL || rank == NULL)
        return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}
ALIAS(ncclCommUserRank)

EXPORT ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    struct comm_info *c = info(comm);
    if (c == NULL || device == NULL)
        return ncclInvalidArgument;
    *device = c->device;
    return ncclSuccess;
}
ALIAS(ncclCommCuDevice)

EXPORT ncclResult_t ncclMemAlloc(void **ptr, size_t size)
{
    if (ptr == NULL || size == 0)
        return ncclInvalidArgument;
    *ptr = (void *)(uintptr_t)mem_cursor;
    mem_cursor += size;
    return ncclSuccess;
}
ALIAS(ncclMemAlloc)

EXPORT ncclResult_t ncclMemFree(void *ptr)
{
    (void)ptr;
    return ncclSuccess;
}
ALIAS(ncclMemFree)

/* A collective's common checks; root_or_peer < 0 means none. */
static ncclResult_t check(ncclComm_t comm, ncclDataType_t datatype, int op, int root_or_peer)
{
    struct comm_info *c = info(comm);
    if (c == NULL || datatype < 0 || datatype >= NUM_TYPES || op < 0 || op >= NUM_OPS)
        return ncclInvalidArgument;
    if (root_or_peer != -1 && (root_or_peer < 0 || root_or_peer >= c->nranks))
        return ncclInvalidArgument;
    return ncclSuccess;
}

static uint64_t monotonic_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

typedef int (*module_load_fn)(void **, const void *);
typedef int (*get_function_fn)(void **, void *, const char *);
typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);

/* The rendezvous kernel: [start, end) on `stream`, through the stand-in libcuda. */
static void launch_waiting_kernel(cudaStream_t stream, uint64_t start, uint64_t end)
{
    static void *function;
    static const char image[] = "stand-in libnccl kernels";
    module_load_fn load = (module_load_fn)dlsym(RTLD_DEFAULT, "cuModuleLoadData");
    get_function_fn get = (get_function_fn)dlsym(RTLD_DEFAULT, "cuModuleGetFunction");
    launch_fn launch = (launch_fn)dlsym(RTLD_DEFAULT, "cuLaunchKernel");
    standin_next_kernel_times_fn times =
        (standin_next_kernel_times_fn)dlsym(RTLD_DEFAULT, STANDIN_NEXT_KERNEL_TIMES);
    if (load == NULL || get == NULL || launch == NULL || times == NULL)
        return;
    if (function == NULL) {
        void *module = NULL;
        if (load(&module, image) != 0 ||
            get(&function, module, "ncclDevKernel_AllReduce_Sum_f32_RING_LL") != 0)
            return;
    }
    times(start, end);
    launch(function, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL);
}

/* NCCL_STANDIN_RENDEZVOUS (see the top of the file). */
static void rendezvous(struct comm_info *c, cudaStream_t stream, uint64_t arrival)
{
    const char *dir = getenv("NCCL_STANDIN_RENDEZVOUS");
    if (dir == NULL || !c->has_id)
        return;
    unsigned long long n = ++c->all_reduces;
    char path[4096], temporary[4200];
    snprintf(path, sizeof(path), "%s/%016llx-%llu.%d", dir, (unsigned long long)c->id, n,
             c->rank);
    snprintf(temporary, sizeof(temporary), "%s.tmp", path);
    FILE *out = fopen(temporary, "w");
    if (out == NULL)
        return;
    fprintf(out, "%llu\n", (unsigned long long)arrival);
    if (fclose(out) != 0 || rename(temporary, path) != 0)
        return;
    uint64_t last = arrival, give_up = monotonic_ns() + 60000000000ull;
    for (int rank = 0; rank < c->nranks; rank++) {
        snprintf(path, sizeof(path), "%s/%016llx-%llu.%d", dir, (unsigned long long)c->id, n,
                 rank);
        for (;;) {
            unsigned long long at = 0;
            FILE *in = fopen(path, "r");
            int read = in != NULL && fscanf(in, "%llu", &at) == 1;
            if (in != NULL)
                fclose(in);
            if (read) {
                if (at > last)
                    last = at;
                break;
            }
            if (monotonic_ns() > give_up)
                return;
            usleep(50);
        }
    }
    const char *transfer = getenv("NCCL_STANDIN_TRANSFER_NS");
    uint64_t transfer_ns = transfer != NULL ? strtoull(transfer, NULL, 10) : 100000;
    uint64_t end = last + STANDIN_GPU_DELAY_NS + transfer_ns;
    launch_waiting_kernel(stream, arrival + STANDIN_GPU_DELAY_NS, end);
    /* Back at the kernels' end, as a caller that synchronises its stream: the next
     * kernel on the stream starts after this one. */
    while (monotonic_ns() < end)
        usleep(20);
}

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                  cudaStream_t stream)
{
    uint64_t arrival = monotonic_ns();
    (void)sendbuff, (void)recvbuff, (void)count;
    ncclResult_t rc = check(comm, datatype, op, -1);
    if (rc == ncclSuccess)
        rendezvous(info(comm), stream, arrival);
    return rc;
}
ALIAS(ncclAllReduce)

EXPORT ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, int root, ncclComm_t comm,
                                  cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)stream;
    return check(comm, datatype, 0, root);
}
ALIAS(ncclBroadcast)

/* As NCCL 2.28 does, ncclBcast is ncclBroadcast in place, called through the exported
 * symbol (-fPIC keeps it interposable, so it is a real call into the probed function,
 * never inlined): a trace has an ncclBroadcast line inside each ncclBcast. */
EXPORT ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                              ncclComm_t comm, cudaStream_t stream)
{
    return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
ALIAS(ncclBcast)

EXPORT ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, int root,
                               ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)stream;
    return check(comm, datatype, op, root);
}
ALIAS(ncclReduce)

EXPORT ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)sendcount, (void)stream;
    return check(comm, datatype, 0, -1);
}
ALIAS(ncclAllGather)

EXPORT ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                      ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                      cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)recvcount, (void)stream;
    return check(comm, datatype, op, -1);
}
ALIAS(ncclReduceScatter)

EXPORT ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)stream;
    return check(comm, datatype, 0, -1);
}
ALIAS(ncclAlltoAll)

EXPORT ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)stream;
    return check(comm, datatype, 0, root);
}
ALIAS(ncclGather)

EXPORT ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    (void)sendbuff, (void)recvbuff, (void)count, (void)stream;
    return check(comm, datatype, 0, root);
}
ALIAS(ncclScatter)

EXPORT ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    (void)sendbuff, (void)count, (void)stream;
    return check(comm, datatype, 0, peer);
}
ALIAS(ncclSend)

EXPORT ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                             ncclComm_t comm, cudaStream_t stream)
{
    (void)recvbuff, (void)count, (void)stream;
    return check(comm, datatype, 0, peer);
}
ALIAS(ncclRecv)

EXPORT ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}
ALIAS(ncclGroupStart)

EXPORT ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return ncclInvalidUsage;
    group_depth--;
    return ncclSuccess;
}
ALIAS(ncclGroupEnd)
