/*
 * libnvml_standin.c -- cudatrace's STAND-IN libnvidia-ml.so.1, for tests ONLY.
 *
 *      THIS IS NOT NVIDIA'S NVML.  It measures nothing.
 *
 * It exports the subset of NVML that `cudatrace run --power` uses, under the real names
 * with the real signatures (nvml.h, driver 580), and answers with values the tests can
 * predict:
 *
 *   device i (0-based)       power P_i = NVML_STANDIN_POWER_MW * (i + 1) mW, constant
 *                            (default 100000: 100 W, 200 W, ...)
 *   nvmlDeviceGetPowerUsage                        P_i
 *   nvmlDeviceGetFieldValues, NVML_FI_DEV_POWER_INSTANT (186)   P_i, UNSIGNED_INT
 *                            (any other field id: NVML_ERROR_NOT_SUPPORTED in its entry)
 *   nvmlDeviceGetTotalEnergyConsumption            floor(P_i * t / 1e9) mJ, where t is
 *                            CLOCK_MONOTONIC in ns at the call: exactly P_i watts since
 *                            boot, so the energy between two reads is P_i * dt (+-1 mJ)
 *   nvmlDeviceGetClockInfo   SM 1980 MHz, MEM 2619 MHz (other clock types 1000)
 *   nvmlDeviceGetUtilizationRates                  gpu 42 %, memory 17 %
 *   nvmlDeviceGetTemperature (GPU sensor)          55 + i degrees C
 *   nvmlDeviceGetMemoryInfo_v2                     used (1 GiB + i MiB), total 80 GiB,
 *                            reserved 512 MiB; the struct's version must be
 *                            nvmlMemory_v2 (else NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
 *   nvmlDeviceGetName        "cudatrace stand-in GPU i"
 *   nvmlDeviceGetUUID        "GPU-00000000-0000-0000-0000-00000000000i"
 *   nvmlDeviceGetPowerManagementLimit, nvmlDeviceGetEnforcedPowerLimit   700000 mW
 *   nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion   "cudatrace-standin"
 *
 * Every device call before nvmlInit_v2 (or after the last nvmlShutdown) returns
 * NVML_ERROR_UNINITIALIZED; a NULL output or an unknown handle NVML_ERROR_INVALID_ARGUMENT;
 * a buffer too short NVML_ERROR_INSUFFICIENT_SIZE.
 *
 * Switches (environment of the process that loads the library, read at nvmlInit):
 *   NVML_STANDIN_DEVICES=N          N devices (1 to 4; default 1)
 *   NVML_STANDIN_POWER_MW=MW        device 0's power (default 100000)
 *   NVML_STANDIN_NO_ENERGY=LIST     nvmlDeviceGetTotalEnergyConsumption returns
 *                                   NVML_ERROR_NOT_SUPPORTED for the devices listed
 *                                   (comma-separated indexes) or for `all`
 *   NVML_STANDIN_INIT_ERROR=RC      nvmlInit_v2 / nvmlInitWithFlags return RC
 *                                   (9 = NVML_ERROR_DRIVER_NOT_LOADED)
 *   NVML_STANDIN_FAIL_POWER_EVERY=K every K-th nvmlDeviceGetPowerUsage call of the process
 *                                   (the K-th, 2K-th, ...; all devices count together)
 *                                   returns NVML_ERROR_UNKNOWN (999)
 *
 * It exports the marker cudatrace_standin_nvml, by which cudatrace tells it is this
 * stand-in and says so wherever it names the library.
 *
 * Build (standin/README.md):
 *   gcc -shared -fPIC -O2 -g -Wall -Wextra -Werror -Wl,-soname,libnvidia-ml.so.1 \
 *       -o OUT/libnvidia-ml.so.1 standin/libnvml_standin.c
 */

#define _GNU_SOURCE
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* nvml.h's types and constants, as the real header has them. */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef int nvmlClockType_t;
enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2 };
typedef int nvmlTemperatureSensors_t;
enum { NVML_TEMPERATURE_GPU = 0 };
typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;
typedef struct nvmlMemory_v2_st {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24U))
#define nvmlMemory_v2 NVML_STRUCT_VERSION(sizeof(nvmlMemory_v2_t), 2)
typedef int nvmlValueType_t;
enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1 };
typedef union nvmlValue_st {
    double dVal;
    int siVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    nvmlValueType_t valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;
#define NVML_FI_DEV_POWER_INSTANT 186

_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");
_Static_assert(offsetof(nvmlFieldValue_t, valueType) == 24, "nvmlFieldValue_t layout");
_Static_assert(offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t layout");

EXPORT const char cudatrace_standin_nvml[] = "cudatrace stand-in libnvidia-ml (not NVIDIA's NVML)";

#define MAX_DEVICES 4

struct nvmlDevice_st {
    unsigned int index;
};

static struct nvmlDevice_st devices[MAX_DEVICES] = {{0}, {1}, {2}, {3}};
static atomic_int init_count;
static unsigned int device_count = 1;
static unsigned long long power_mw = 100000;
static int no_energy[MAX_DEVICES];
static unsigned long long fail_power_every;
static atomic_ullong power_calls;

static unsigned long long env_number(const char *name, unsigned long long fallback)
{
    const char *value = getenv(name);
    if (value == NULL || *value == '\0')
        return fallback;
    return strtoull(value, NULL, 10);
}

static void read_switches(void)
{
    device_count = (unsigned int)env_number("NVML_STANDIN_DEVICES", 1);
    if (device_count < 1)
        device_count = 1;
    if (device_count > MAX_DEVICES)
        device_count = MAX_DEVICES;
    power_mw = env_number("NVML_STANDIN_POWER_MW", 100000);
    fail_power_every = env_number("NVML_STANDIN_FAIL_POWER_EVERY", 0);
    const char *list = getenv("NVML_STANDIN_NO_ENERGY");
    for (unsigned int i = 0; i < MAX_DEVICES; i++)
        no_energy[i] = list != NULL && strcmp(list, "all") == 0;
    if (list != NULL && strcmp(list, "all") != 0) {
        const char *p = list;
        while (*p != '\0') {
            char *end;
            unsigned long index = strtoul(p, &end, 10);
            if (end == p)
                break;
            if (index < MAX_DEVICES)
                no_energy[index] = 1;
            p = *end == ',' ? end + 1 : end;
        }
    }
}

static nvmlReturn_t init(void)
{
    nvmlReturn_t forced = (nvmlReturn_t)env_number("NVML_STANDIN_INIT_ERROR", 0);
    if (forced != NVML_SUCCESS)
        return forced;
    read_switches();
    atomic_fetch_add(&init_count, 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return init();
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    return init();
}

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    int count = atomic_load(&init_count);
    while (count > 0 && !atomic_compare_exchange_weak(&init_count, &count, count - 1)) {
    }
    return count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    default:
        return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(const char *text, char *out, unsigned int length)
{
    if (atomic_load(&init_count) == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, text);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    return copy_string("cudatrace-standin", version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    return copy_string("cudatrace-standin", version, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (atomic_load(&init_count) == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = device_count;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (atomic_load(&init_count) == 0)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= device_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

/* The device's index, or -1 (with *rc set) when the call cannot proceed. */
static int check(nvmlDevice_t device, const void *out, nvmlReturn_t *rc)
{
    if (atomic_load(&init_count) == 0) {
        *rc = NVML_ERROR_UNINITIALIZED;
        return -1;
    }
    if (out == NULL || device < &devices[0] || device >= &devices[device_count]) {
        *rc = NVML_ERROR_INVALID_ARGUMENT;
        return -1;
    }
    *rc = NVML_SUCCESS;
    return (int)device->index;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    nvmlReturn_t rc;
    int index = check(device, name, &rc);
    if (index < 0)
        return rc;
    char text[64];
    snprintf(text, sizeof text, "cudatrace stand-in GPU %d", index);
    return copy_string(text, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    nvmlReturn_t rc;
    int index = check(device, uuid, &rc);
    if (index < 0)
        return rc;
    char text[64];
    snprintf(text, sizeof text, "GPU-00000000-0000-0000-0000-%012d", index);
    return copy_string(text, uuid, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    nvmlReturn_t rc;
    if (check(device, limit, &rc) < 0)
        return rc;
    *limit = 700000;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return nvmlDeviceGetPowerManagementLimit(device, limit);
}

static unsigned long long device_power_mw(int index)
{
    return power_mw * (unsigned long long)(index + 1);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    nvmlReturn_t rc;
    int index = check(device, power, &rc);
    if (index < 0)
        return rc;
    unsigned long long call = atomic_fetch_add(&power_calls, 1) + 1;
    if (fail_power_every > 0 && call % fail_power_every == 0)
        return NVML_ERROR_UNKNOWN;
    *power = (unsigned int)device_power_mw(index);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                        unsigned long long *energy)
{
    nvmlReturn_t rc;
    int index = check(device, energy, &rc);
    if (index < 0)
        return rc;
    if (no_energy[index])
        return NVML_ERROR_NOT_SUPPORTED;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    unsigned __int128 ns = (unsigned __int128)now.tv_sec * 1000000000u + (unsigned)now.tv_nsec;
    *energy = (unsigned long long)(ns * device_power_mw(index) / 1000000000u);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                             nvmlFieldValue_t *values)
{
    nvmlReturn_t rc;
    int index = check(device, values, &rc);
    if (index < 0)
        return rc;
    if (valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *field = &values[i];
        field->timestamp = (long long)now.tv_sec * 1000000 + now.tv_nsec / 1000;
        field->latencyUsec = 0;
        if (field->fieldId == NVML_FI_DEV_POWER_INSTANT) {
            field->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            field->value.uiVal = (unsigned int)device_power_mw(index);
            field->nvmlReturn = NVML_SUCCESS;
        } else {
            field->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                           unsigned int *clock)
{
    nvmlReturn_t rc;
    if (check(device, clock, &rc) < 0)
        return rc;
    *clock = type == NVML_CLOCK_SM ? 1980 : type == NVML_CLOCK_MEM ? 2619 : 1000;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                  nvmlUtilization_t *utilization)
{
    nvmlReturn_t rc;
    if (check(device, utilization, &rc) < 0)
        return rc;
    utilization->gpu = 42;
    utilization->memory = 17;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                             nvmlTemperatureSensors_t sensor, unsigned int *temp)
{
    nvmlReturn_t rc;
    int index = check(device, temp, &rc);
    if (index < 0)
        return rc;
    if (sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 55 + (unsigned int)index;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlReturn_t rc;
    int index = check(device, memory, &rc);
    if (index < 0)
        return rc;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory->total = 80ull << 30;
    memory->reserved = 512ull << 20;
    memory->used = (1ull << 30) + ((unsigned long long)index << 20);
    memory->free = memory->total - memory->reserved - memory->used;
    return NVML_SUCCESS;
}
