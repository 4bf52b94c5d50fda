/*
 * bench_loop.c -- timing loop for `cargo xtask bench`, built as
 * `cudatrace-bench-loop` and linked against the STAND-IN libcuda
 * (standin/libcuda_standin.c), never against NVIDIA's driver.
 *
 * Build (xtask/src/bench.rs runs this; see standin/README.md):
 *   gcc -O2 -g -Wall -Wextra -Werror -o OUT/cudatrace-bench-loop \
 *       standin/bench_loop.c -LOUT -l:libcuda.so.1 -Wl,-rpath,'$ORIGIN' -lpthread
 *
 * Usage: cudatrace-bench-loop N [RATE [THREADS [FUNCTION]]]
 *
 *   N        calls of FUNCTION per thread (after WARMUP calls that are not
 *            timed; they are traced like the others)
 *   RATE     0 (default): as fast as possible.  Otherwise the total target
 *            rate in calls/s over all threads: each thread issues its k-th call
 *            no earlier than start + k * THREADS / RATE seconds, busy-waiting on
 *            CLOCK_MONOTONIC (no sleeping, so the CPU stays busy as a real
 *            launch loop would).
 *   THREADS  calling threads (default 1); they start together at a barrier.
 *   FUNCTION cuCtxSynchronize (default; no arguments) or cuLaunchKernel (eleven
 *            arguments, five on the stack: the launch path of a real workload).
 *
 * With CUDATRACE_BENCH_CUINIT=1 in the environment it calls cuInit(0) first (one call
 * more), which loads CUDA_INJECTION64_PATH as the driver does: for `run --gpu` against the
 * stand-in libcupti, whose records of each launch then pass through cudatrace.
 *
 * Prints one JSON line on stdout:
 *   {"calls":TOTAL,"threads":T,"ns":ELAPSED,"ns_per_call":X,"calls_per_s":R,
 *    "target_calls_per_s":RATE,"user_ns":U,"sys_ns":S,"process_cpu_ns":C}
 * where TOTAL counts the timed calls only (WARMUP more per thread came before),
 * ELAPSED is CLOCK_MONOTONIC from the barrier to the last thread's end,
 * ns_per_call = ELAPSED * T / TOTAL (time one thread spends per call),
 * calls_per_s = TOTAL / ELAPSED, U and S the process's user and system CPU
 * time (all threads, getrusage) over the timed part, and C its whole CPU time
 * up to the print.  Any cuCtxSynchronize result other than CUDA_SUCCESS
 * exits 3; bad usage exits 2.
 */

#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cuda_standin.h"

#define WARMUP 1000ULL
#define MAX_THREADS 64

static unsigned long long g_calls;
static double g_rate;
static int g_threads;
static pthread_barrier_t g_barrier;
static unsigned long long g_start_ns;
static unsigned long long g_end_ns[MAX_THREADS];

static unsigned long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static unsigned long long tv_ns(struct timeval tv)
{
    return (unsigned long long)tv.tv_sec * 1000000000ULL + (unsigned long long)tv.tv_usec * 1000ULL;
}

static struct rusage g_usage_start;

static int g_launch;

static void call_once(void)
{
    CUresult r;
    if (g_launch)
        /* The stand-in launches nothing; the handle only has to be the same each time. */
        r = cuLaunchKernel((CUfunction)0x1000, 64, 1, 1, 128, 1, 1, 0, (CUstream)0, NULL, NULL);
    else
        r = cuCtxSynchronize();
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cudatrace-bench-loop: %s returned %d\n",
                g_launch ? "cuLaunchKernel" : "cuCtxSynchronize", (int)r);
        exit(3);
    }
}

static void *worker(void *arg)
{
    int index = (int)(long)arg;
    for (unsigned long long i = 0; i < WARMUP; i++)
        call_once();
    pthread_barrier_wait(&g_barrier);
    if (index == 0) {
        getrusage(RUSAGE_SELF, &g_usage_start);
        g_start_ns = now_ns();
    }
    pthread_barrier_wait(&g_barrier);
    unsigned long long start = g_start_ns;
    if (g_rate <= 0) {
        for (unsigned long long i = 0; i < g_calls; i++)
            call_once();
    } else {
        /* Per-thread period in ns, kept as a double so high rates stay exact. */
        double period = 1e9 * (double)g_threads / g_rate;
        for (unsigned long long i = 0; i < g_calls; i++) {
            unsigned long long due = start + (unsigned long long)((double)i * period);
            while (now_ns() < due)
                ;
            call_once();
        }
    }
    g_end_ns[index] = now_ns();
    return NULL;
}

static int parse_u64(const char *s, unsigned long long *out)
{
    char *end;
    *out = strtoull(s, &end, 10);
    return *s != '\0' && *end == '\0';
}

int main(int argc, char **argv)
{
    unsigned long long threads = 1, rate = 0;
    if (argc > 4)
        g_launch = strcmp(argv[4], "cuLaunchKernel") == 0;
    if (argc < 2 || argc > 5 || !parse_u64(argv[1], &g_calls) || g_calls == 0 ||
        (argc > 2 && !parse_u64(argv[2], &rate)) ||
        (argc > 3 && (!parse_u64(argv[3], &threads) || threads == 0 || threads > MAX_THREADS)) ||
        (argc > 4 && !g_launch && strcmp(argv[4], "cuCtxSynchronize") != 0)) {
        fprintf(stderr, "usage: cudatrace-bench-loop N [RATE [THREADS [cuCtxSynchronize|cuLaunchKernel]]]\n");
        return 2;
    }
    const char *init = getenv("CUDATRACE_BENCH_CUINIT");
    if (init != NULL && strcmp(init, "1") == 0 && cuInit(0) != CUDA_SUCCESS) {
        fprintf(stderr, "cudatrace-bench-loop: cuInit failed\n");
        return 3;
    }
    g_rate = (double)rate;
    g_threads = (int)threads;
    pthread_barrier_init(&g_barrier, NULL, (unsigned)threads);
    pthread_t tids[MAX_THREADS];
    for (int t = 1; t < g_threads; t++) {
        if (pthread_create(&tids[t], NULL, worker, (void *)(long)t) != 0) {
            fprintf(stderr, "cudatrace-bench-loop: pthread_create failed\n");
            return 3;
        }
    }
    worker((void *)0L);
    unsigned long long end = g_end_ns[0];
    for (int t = 1; t < g_threads; t++) {
        pthread_join(tids[t], NULL);
        if (g_end_ns[t] > end)
            end = g_end_ns[t];
    }
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    unsigned long long user = tv_ns(usage.ru_utime), sys = tv_ns(usage.ru_stime);
    unsigned long long elapsed = end - g_start_ns;
    unsigned long long total = g_calls * threads;
    printf("{\"calls\":%llu,\"threads\":%d,\"ns\":%llu,\"ns_per_call\":%.2f,"
           "\"calls_per_s\":%.0f,\"target_calls_per_s\":%llu,\"user_ns\":%llu,\"sys_ns\":%llu,"
           "\"process_cpu_ns\":%llu}\n",
           total, g_threads, elapsed, (double)elapsed * (double)threads / (double)total,
           (double)total * 1e9 / (double)elapsed, rate, user - tv_ns(g_usage_start.ru_utime),
           sys - tv_ns(g_usage_start.ru_stime), user + sys);
    return 0;
}
