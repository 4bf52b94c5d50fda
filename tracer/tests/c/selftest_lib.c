/* Test library for `cudatrace selftest`: one probed function. */
#include <stdint.h>

static volatile int64_t sink;

__attribute__((visibility("default"), noinline)) int64_t cudatrace_selftest_add(int64_t a, int64_t b)
{
    sink = a;
    return a + b;
}
