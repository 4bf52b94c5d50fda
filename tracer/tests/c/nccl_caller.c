/*
 * nccl_caller.c -- test program for the NCCL probe set, built by the root tests. It is
 * NOT linked against NCCL: it dlopen()s the stand-in libnccl (standin/libnccl_standin.c)
 * from the path given, as PyTorch loads the NCCL of its wheel, and calls into it at once.
 * Unexpected results exit 3, bad usage 2; success prints "ok\n".
 *
 *   nccl_caller PATH    the fixed list below (buffers are fake pointers: the stand-in
 *                       never reads them; S = 0x10000, R = 0x20000, stream T = 0x5150)
 *
 *   ncclGetVersion(&v)                                      v = 22809
 *   ncclCommInitRank(&c, 2, id, 1)                          c = 0x2000; id byte i = i
 *   ncclCommCuDevice(c, &d)                                 d = 0
 *   3 x ncclAllReduce(S, R, 1000, float32, sum, c, T)
 *   pncclAllReduce(S, R, 10, float16, max, c, T)            through the alias
 *   ncclBroadcast(S, R, 4096, int8, root 1, c, T)
 *   ncclBcast(R, 100, int32, root 0, c, T)
 *   ncclReduce(S, R, 10, float64, min, root 1, c, 0x5151)
 *   ncclAllGather(S, R, 256, bfloat16, c, T)
 *   ncclReduceScatter(S, R, 128, int64, avg, c, T)
 *   ncclAlltoAll(S, R, 64, uint8, c, T)
 *   ncclGather(S, R, 32, uint32, root 0, c, T)
 *   ncclScatter(S, R, 16, uint64, root 1, c, T)
 *   ncclGroupStart(); ncclSend(S, 100, float16, peer 0, c, T);
 *                     ncclRecv(R, 100, float16, peer 0, c, T); ncclGroupEnd()
 *   ncclCommSplit(c, 7, 3, &k, NULL)                        k = 0x2010
 *   ncclAllReduce(S, R, 5, float32, sum, k, T)              rank of k not known yet
 *   ncclCommUserRank(k, &r); ncclCommCount(k, &n)           r = 0, n = 1
 *   ncclAllReduce(S, R, 6, float32, sum, k, T)
 *   ncclCommInitAll(a, 2, NULL)                             a = {0x2020, 0x2030}
 *   ncclAllReduce(S, R, 8, float32, prod, a[1], T)
 *   ncclAllReduce(S, R, 8, type 12, sum, c, T)              -> ncclInvalidArgument (4)
 *   ncclGroupEnd()                                          -> ncclInvalidUsage (5)
 *   ncclCommDestroy(a[0]); ncclCommDestroy(a[1]); ncclCommFinalize(c); ncclCommDestroy(c)
 *
 *   nccl_caller PATH job RANK NRANKS COUNT LATE_US LIBCUDA|-
 *                       one rank of a job (run one process per rank, with the stand-in's
 *                       NCCL_STANDIN_RENDEZVOUS set for all): LIBCUDA, when given, is
 *                       dlopen()ed into the global scope and cuInit(0) called (with
 *                       cudatrace --gpu, that loads the injection: the stand-in libnccl's
 *                       kernels are then recorded); then
 *   ncclCommInitRank(&c, NRANKS, id, RANK)                  id byte i = 0xa0 + i
 *   COUNT x ncclAllReduce(S, R, 1048576, float32, sum, c, T)
 *                       the last rank sleeping LATE_US before numbers 3, 6, 9, ...
 *   ncclCommDestroy(c)
 */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *comm_t;
typedef int (*version_fn)(int *);
typedef int (*init_rank_fn)(comm_t *, int, ncclUniqueId, int);
typedef int (*init_all_fn)(comm_t *, int, const int *);
typedef int (*split_fn)(comm_t, int, int, comm_t *, void *);
typedef int (*comm_fn)(comm_t);
typedef int (*comm_int_fn)(comm_t, int *);
typedef int (*all_reduce_fn)(const void *, void *, size_t, int, int, comm_t, void *);
typedef int (*rooted_fn)(const void *, void *, size_t, int, int, comm_t, void *);
typedef int (*bcast_fn)(void *, size_t, int, int, comm_t, void *);
typedef int (*reduce_fn)(const void *, void *, size_t, int, int, int, comm_t, void *);
typedef int (*gather_all_fn)(const void *, void *, size_t, int, comm_t, void *);
typedef int (*p2p_fn)(const void *, size_t, int, int, comm_t, void *);
typedef int (*group_fn)(void);

static void *library;

static void *symbol(const char *name)
{
    void *address = dlsym(library, name);
    if (address == NULL) {
        fprintf(stderr, "nccl_caller: dlsym %s: %s\n", name, dlerror());
        exit(3);
    }
    return address;
}

static void expect(const char *what, long got, long want)
{
    if (got != want) {
        fprintf(stderr, "nccl_caller: %s gave %ld, expected %ld\n", what, got, want);
        exit(3);
    }
}

#define S ((const void *)0x10000)
#define R ((void *)0x20000)
#define T ((void *)0x5150)

enum { INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 };
enum { SUM, PROD, MAX, MIN, AVG };

/* `job`: one rank of a job (the usage above). */
static int job(char **argv)
{
    int rank = atoi(argv[3]), nranks = atoi(argv[4]), count = atoi(argv[5]);
    useconds_t late_us = (useconds_t)atoi(argv[6]);
    if (strcmp(argv[7], "-") != 0) {
        void *cuda = dlopen(argv[7], RTLD_NOW | RTLD_GLOBAL);
        if (cuda == NULL) {
            fprintf(stderr, "nccl_caller: dlopen %s: %s\n", argv[7], dlerror());
            return 3;
        }
        int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, "cuInit");
        expect("cuInit", init == NULL ? -1 : init(0), 0);
    }
    ncclUniqueId id;
    for (int i = 0; i < 128; i++)
        id.internal[i] = (char)(0xa0 + i);
    comm_t comm = NULL;
    expect("ncclCommInitRank",
           ((init_rank_fn)symbol("ncclCommInitRank"))(&comm, nranks, id, rank), 0);
    all_reduce_fn all_reduce = (all_reduce_fn)symbol("ncclAllReduce");
    for (int n = 1; n <= count; n++) {
        if (rank == nranks - 1 && n % 3 == 0)
            usleep(late_us);
        expect("ncclAllReduce", all_reduce(S, R, 1048576, FLOAT32, SUM, comm, T), 0);
    }
    expect("ncclCommDestroy", ((comm_fn)symbol("ncclCommDestroy"))(comm), 0);
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 8 && strcmp(argv[2], "job") == 0) {
        library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (library == NULL) {
            fprintf(stderr, "nccl_caller: dlopen %s: %s\n", argv[1], dlerror());
            return 3;
        }
        return job(argv);
    }
    if (argc != 2) {
        fprintf(stderr, "usage: nccl_caller PATH\n");
        return 2;
    }
    library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        fprintf(stderr, "nccl_caller: dlopen %s: %s\n", argv[1], dlerror());
        return 3;
    }
    int value = 0;
    expect("ncclGetVersion", ((version_fn)symbol("ncclGetVersion"))(&value), 0);
    expect("version", value, 22809);

    ncclUniqueId id;
    for (int i = 0; i < 128; i++)
        id.internal[i] = (char)i;
    comm_t comm = NULL;
    expect("ncclCommInitRank", ((init_rank_fn)symbol("ncclCommInitRank"))(&comm, 2, id, 1), 0);
    expect("comm", (long)(uintptr_t)comm, 0x2000);
    expect("ncclCommCuDevice", ((comm_int_fn)symbol("ncclCommCuDevice"))(comm, &value), 0);

    all_reduce_fn all_reduce = (all_reduce_fn)symbol("ncclAllReduce");
    for (int i = 0; i < 3; i++)
        expect("ncclAllReduce", all_reduce(S, R, 1000, FLOAT32, SUM, comm, T), 0);
    expect("pncclAllReduce",
           ((all_reduce_fn)symbol("pncclAllReduce"))(S, R, 10, FLOAT16, MAX, comm, T), 0);
    expect("ncclBroadcast",
           ((rooted_fn)symbol("ncclBroadcast"))(S, R, 4096, INT8, 1, comm, T), 0);
    expect("ncclBcast", ((bcast_fn)symbol("ncclBcast"))(R, 100, INT32, 0, comm, T), 0);
    expect("ncclReduce",
           ((reduce_fn)symbol("ncclReduce"))(S, R, 10, FLOAT64, MIN, 1, comm, (void *)0x5151),
           0);
    expect("ncclAllGather",
           ((gather_all_fn)symbol("ncclAllGather"))(S, R, 256, BFLOAT16, comm, T), 0);
    expect("ncclReduceScatter",
           ((all_reduce_fn)symbol("ncclReduceScatter"))(S, R, 128, INT64, AVG, comm, T), 0);
    expect("ncclAlltoAll", ((gather_all_fn)symbol("ncclAlltoAll"))(S, R, 64, UINT8, comm, T),
           0);
    expect("ncclGather", ((rooted_fn)symbol("ncclGather"))(S, R, 32, UINT32, 0, comm, T), 0);
    expect("ncclScatter", ((rooted_fn)symbol("ncclScatter"))(S, R, 16, UINT64, 1, comm, T), 0);

    group_fn group_start = (group_fn)symbol("ncclGroupStart");
    group_fn group_end = (group_fn)symbol("ncclGroupEnd");
    expect("ncclGroupStart", group_start(), 0);
    expect("ncclSend", ((p2p_fn)symbol("ncclSend"))(S, 100, FLOAT16, 0, comm, T), 0);
    expect("ncclRecv", ((p2p_fn)symbol("ncclRecv"))(R, 100, FLOAT16, 0, comm, T), 0);
    expect("ncclGroupEnd", group_end(), 0);

    comm_t child = NULL;
    expect("ncclCommSplit", ((split_fn)symbol("ncclCommSplit"))(comm, 7, 3, &child, NULL), 0);
    expect("child", (long)(uintptr_t)child, 0x2010);
    expect("ncclAllReduce child", all_reduce(S, R, 5, FLOAT32, SUM, child, T), 0);
    expect("ncclCommUserRank", ((comm_int_fn)symbol("ncclCommUserRank"))(child, &value), 0);
    expect("child rank", value, 0);
    expect("ncclCommCount", ((comm_int_fn)symbol("ncclCommCount"))(child, &value), 0);
    expect("child nranks", value, 1);
    expect("ncclAllReduce child", all_reduce(S, R, 6, FLOAT32, SUM, child, T), 0);

    comm_t all[2] = { NULL, NULL };
    expect("ncclCommInitAll", ((init_all_fn)symbol("ncclCommInitAll"))(all, 2, NULL), 0);
    expect("all[1]", (long)(uintptr_t)all[1], 0x2030);
    expect("ncclAllReduce all[1]", all_reduce(S, R, 8, FLOAT32, PROD, all[1], T), 0);

    expect("ncclAllReduce bad type", all_reduce(S, R, 8, 12, SUM, comm, T), 4);
    expect("ncclGroupEnd alone", group_end(), 5);

    comm_fn destroy = (comm_fn)symbol("ncclCommDestroy");
    expect("ncclCommDestroy", destroy(all[0]), 0);
    expect("ncclCommDestroy", destroy(all[1]), 0);
    expect("ncclCommFinalize", ((comm_fn)symbol("ncclCommFinalize"))(comm), 0);
    expect("ncclCommDestroy", destroy(comm), 0);
    printf("ok\n");
    return 0;
}
