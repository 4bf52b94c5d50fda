/*
 * cupti_api_count.c -- NVIDIA's own count of driver API calls, for comparing with
 * `cudatrace run --functions all` (workloads/fidelity_gpu.sh builds and uses it).
 *
 * A CUDA injection library: the driver loads it at cuInit when CUDA_INJECTION64_PATH
 * names it and calls InitializeInjection, which subscribes to CUPTI's callback API for
 * the whole driver API domain (no activity records, so CUPTI itself stays quiet). Every
 * API entry is counted by callback id; at exit the counts go to
 * $CUPTI_API_COUNT_OUT.<pid> as lines "cbid name count" (name: CUPTI's functionName).
 * Calls made before cuInit loaded the library (cuGetProcAddress, cuDriverGetVersion,
 * cuInit itself) are not seen by CUPTI.
 *
 * Build on the GPU machine (CUPTI headers and library from the Python's NVIDIA wheels,
 * cuda.h from the CUDA toolkit or the same wheels):
 *   gcc -shared -fPIC -O2 -Wall -I$CUPTI_INCLUDE -I$CUDA_INCLUDE -o libcupti_api_count.so \
 *       workloads/cupti_api_count.c -L$CUPTI_LIB -l:libcupti.so.13 -Wl,-rpath,$CUPTI_LIB
 */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_CBID 4096

static unsigned long long g_counts[MAX_CBID];
static const char *g_names[MAX_CBID];
static unsigned long long g_out_of_range;

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain,
                                 CUpti_CallbackId cbid, const void *cbdata)
{
    (void)userdata;
    const CUpti_CallbackData *data = cbdata;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || data->callbackSite != CUPTI_API_ENTER)
        return;
    if (cbid >= MAX_CBID) {
        __atomic_fetch_add(&g_out_of_range, 1, __ATOMIC_RELAXED);
        return;
    }
    __atomic_fetch_add(&g_counts[cbid], 1, __ATOMIC_RELAXED);
    if (__atomic_load_n(&g_names[cbid], __ATOMIC_RELAXED) == NULL)
        __atomic_store_n(&g_names[cbid], data->functionName, __ATOMIC_RELAXED);
}

static void dump(void)
{
    const char *base = getenv("CUPTI_API_COUNT_OUT");
    if (base == NULL)
        base = "cupti_api_counts";
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", base, (int)getpid());
    FILE *out = fopen(path, "w");
    if (out == NULL) {
        perror(path);
        return;
    }
    for (unsigned cbid = 0; cbid < MAX_CBID; cbid++) {
        unsigned long long count = __atomic_load_n(&g_counts[cbid], __ATOMIC_RELAXED);
        if (count == 0)
            continue;
        const char *name = g_names[cbid];
        if (name == NULL && cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, cbid, &name) !=
                                CUPTI_SUCCESS)
            name = "?";
        fprintf(out, "%u %s %llu\n", cbid, name, count);
    }
    if (g_out_of_range != 0)
        fprintf(out, "-1 out_of_range %llu\n", g_out_of_range);
    fclose(out);
}

int InitializeInjection(void)
{
    CUpti_SubscriberHandle subscriber;
    CUptiResult rc = cuptiSubscribe(&subscriber, on_callback, NULL);
    if (rc == CUPTI_SUCCESS)
        rc = cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
    if (rc != CUPTI_SUCCESS) {
        const char *message = "?";
        cuptiGetResultString(rc, &message);
        fprintf(stderr, "cupti_api_count: CUPTI failed: %s\n", message);
        return 0;
    }
    atexit(dump);
    return 1;
}
