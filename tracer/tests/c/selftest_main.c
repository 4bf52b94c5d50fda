/* Calls cudatrace_selftest_add(i, 1000 + i) for i in 0..N. */
#include <stdint.h>
#include <stdlib.h>

int64_t cudatrace_selftest_add(int64_t a, int64_t b);

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1;
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += cudatrace_selftest_add(i, 1000 + i);
    return total == (int64_t)n * (n - 1) + 1000LL * n ? 0 : 1;
}
