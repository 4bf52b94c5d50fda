/*
 * attach_fork.c -- a program for `cudatrace run -p PID --gpu` tests of children started
 * after the attach, linked against the STAND-IN libcuda (never NVIDIA's driver):
 *
 *   attach_fork ITERATIONS SLEEP_US
 *   attach_fork exec LAUNCHES          (what the child execs)
 *
 * Set up as attach_loop.c (cuInit, a context, "_Z9attach_mev"), prints "ready", then
 * ITERATIONS times: cuLaunchKernel(f, i % 5 + 1, ...) and usleep(SLEEP_US). Once its maps
 * show cudatrace's injection library (the attach happened) and 50 more iterations went
 * by, it forks one child, which
 *   - launches 30 kernels of grid (7,1,1), 1 ms apart, in the forked image (where the
 *     injection library is mapped, its threads gone), then
 *   - execs this program as `attach_fork exec 20`: set-up again, 20 kernels of grid
 *     (9,1,1), 1 ms apart, exit 5.
 * The parent waits for it ("child exited 5", or "child failed"), goes on to the end, and
 * prints "done ITERATIONS launches, N failed", "forked at I" (the iteration) and exits 7.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../../standin/cuda_standin.h"

static const unsigned char k_image[64] = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0x33};

static int set_up(CUfunction *f)
{
    CUcontext ctx;
    CUmodule mod;
    return cuInit(0) || cuDevicePrimaryCtxRetain(&ctx, 0) || cuCtxSetCurrent(ctx) ||
           cuModuleLoadData(&mod, k_image) || cuModuleGetFunction(f, mod, "_Z9attach_mev");
}

static long launch(CUfunction f, unsigned grid, long count)
{
    long failed = 0;
    for (long i = 0; i < count; i++) {
        if (cuLaunchKernel(f, grid, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
            failed++;
        usleep(1000);
    }
    return failed;
}

static int attached(void)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    while (maps && !found && fgets(line, sizeof line, maps))
        found = strstr(line, "libcudatrace_inject") != NULL;
    if (maps)
        fclose(maps);
    return found;
}

int main(int argc, char **argv)
{
    CUfunction f;
    if (argc == 3 && strcmp(argv[1], "exec") == 0) {
        if (set_up(&f))
            return 3;
        return launch(f, 9, atol(argv[2])) ? 4 : 5;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: attach_fork ITERATIONS SLEEP_US\n");
        return 2;
    }
    long iterations = atol(argv[1]);
    long sleep_us = atol(argv[2]);
    if (set_up(&f)) {
        fprintf(stderr, "attach_fork: set-up failed\n");
        return 3;
    }
    printf("ready\n");
    fflush(stdout);
    long failed = 0, seen_at = -1, forked_at = -1;
    for (long i = 0; i < iterations; i++) {
        if (cuLaunchKernel(f, (unsigned)(i % 5 + 1), 1, 1, 32, 1, 1, 0, NULL, NULL, NULL))
            failed++;
        if (sleep_us > 0)
            usleep((useconds_t)sleep_us);
        if (seen_at < 0 && i % 10 == 0 && attached())
            seen_at = i;
        if (seen_at >= 0 && forked_at < 0 && i >= seen_at + 50) {
            forked_at = i;
            fflush(stdout);
            pid_t child = fork();
            if (child == 0) {
                if (launch(f, 7, 30))
                    _exit(4);
                execl("/proc/self/exe", argv[0], "exec", "20", (char *)NULL);
                _exit(6);
            }
            int status = 0;
            if (child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status))
                printf("child exited %d\n", WEXITSTATUS(status));
            else
                printf("child failed\n");
        }
    }
    printf("done %ld launches, %ld failed\nforked at %ld\n", iterations, failed, forked_at);
    return 7;
}
