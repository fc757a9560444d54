/* Simulated NVML (libnvidia-ml.so.1) for tracer's tests: the functions
 * nvml-wrapper calls, answering from the state the simulated CUDA driver
 * shares (SIMCUDA_STATE), so traced allocations show up in NVML's
 * per-process figures as on a real node.
 *
 *   SIMNVML_DEVICES     devices (default 1, at most 8)
 *   SIMCUDA_DEVICE_MEM  memory per device, bytes (default 16 GiB, as the driver)
 *   SIMNVML_DELAY_MS    sleep in every call (a slow driver)
 *   SIMNVML_FAKE_PROCS  extra made-up processes per device (benchmarks), 1 GiB each
 *   SIMNVML_XID_FILE    critical Xid events: each line `DEVICE CODE` appended to
 *                       this file is one event, delivered by nvmlEventSetWait_v2 */
#include "simstate.h"
#include <stdio.h>
#include <string.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId; char busId[32]; } nvmlPciInfo_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_TIMEOUT 10

static int initialized;

static void delay(void) {
    const char *d = getenv("SIMNVML_DELAY_MS");
    if (!d) return;
    long ms = atol(d);
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}
static unsigned devices(void) {
    const char *d = getenv("SIMNVML_DEVICES");
    int n = d ? atoi(d) : 1;
    return n < 1 ? 1 : n > 8 ? 8 : (unsigned)n;
}
static unsigned long long capacity(void) {
    const char *c = getenv("SIMCUDA_DEVICE_MEM");
    return c ? strtoull(c, NULL, 0) : (16ull << 30);
}
static unsigned fake_procs(void) {
    const char *f = getenv("SIMNVML_FAKE_PROCS");
    return f ? (unsigned)atoi(f) : 0;
}
static int index_of(nvmlDevice_t d) { return (int)(uintptr_t)d - 1; }
#define CHECK_DEVICE(d) do { delay(); if (!initialized) return NVML_ERROR_UNINITIALIZED; \
    if (index_of(d) < 0 || index_of(d) >= (int)devices()) return NVML_ERROR_INVALID_ARGUMENT; } while (0)

nvmlReturn_t nvmlInit_v2(void) { delay(); initialized = 1; return NVML_SUCCESS; }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return nvmlInit_v2(); }
nvmlReturn_t nvmlShutdown(void) { initialized = 0; return NVML_SUCCESS; }
const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}
nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) {
    delay();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    snprintf(v, len, "550.54.15-sim");
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) {
    delay();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *n = devices();
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) {
    delay();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (i >= devices()) return NVML_ERROR_INVALID_ARGUMENT;
    *d = (nvmlDevice_t)(uintptr_t)(i + 1);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int len) {
    CHECK_DEVICE(d);
    snprintf(name, len, "Simulated H200");
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int len) {
    CHECK_DEVICE(d);
    snprintf(uuid, len, "GPU-5133c0da-0000-4000-8000-00000000000%d", index_of(d));
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    CHECK_DEVICE(d);
    memset(p, 0, sizeof *p);
    p->bus = 0x18 + index_of(d);
    snprintf(p->busId, sizeof p->busId, "00000000:%02X:00.0", p->bus);
    snprintf(p->busIdLegacy, sizeof p->busIdLegacy, "0000:%02X:00.0", p->bus);
    p->pciDeviceId = 0x233510de;
    return NVML_SUCCESS;
}

/* Used memory: what live processes charged through the driver, plus the
 * made-up processes; reserved is a fixed 512 MiB, as drivers report. */
static unsigned long long used_on(int dev) {
    return sim_device_used(dev) + (unsigned long long)fake_procs() * (1ull << 30);
}
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    CHECK_DEVICE(d);
    unsigned long long total = capacity(), used = used_on(index_of(d)), reserved = 512ull << 20;
    if (used > total) used = total;
    m->total = total; m->reserved = reserved; m->used = used;
    m->free = total > used + reserved ? total - used - reserved : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    CHECK_DEVICE(d);
    u->memory = (unsigned)(used_on(index_of(d)) * 100 / capacity());
    u->gpu = u->memory ? 35 : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    (void)sensor;
    CHECK_DEVICE(d);
    *t = 41 + index_of(d);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    CHECK_DEVICE(d);
    *mw = 120000;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) {
    CHECK_DEVICE(d);
    *r = 0x1; /* GPU idle */
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n) {
    (void)type; (void)counter; (void)n;
    CHECK_DEVICE(d);
    return NVML_ERROR_NOT_SUPPORTED;
}
nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    (void)current; (void)pending;
    CHECK_DEVICE(d);
    return NVML_ERROR_NOT_SUPPORTED;
}

/* Compute processes: every live process with a context on the device. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *out) {
    CHECK_DEVICE(d);
    struct sim_state *st = sim_state_map();
    unsigned n = 0, cap = *count, dev = (unsigned)index_of(d);
    for (int i = 0; st && i < SIM_SLOTS; i++) {
        struct sim_slot *s = &st->slots[i];
        int32_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
        if (pid <= 0 || s->device != (int32_t)dev || !sim_alive(pid)) continue;
        if (out && n < cap) {
            out[n].pid = (unsigned)pid;
            out[n].usedGpuMemory = __atomic_load_n(&s->bytes, __ATOMIC_ACQUIRE);
            out[n].gpuInstanceId = out[n].computeInstanceId = 0xffffffffu;
        }
        n++;
    }
    for (unsigned f = 0; f < fake_procs(); f++, n++) {
        if (out && n < cap) {
            out[n].pid = 4000000 + dev * 1000 + f;
            out[n].usedGpuMemory = 1ull << 30;
            out[n].gpuInstanceId = out[n].computeInstanceId = 0xffffffffu;
        }
    }
    *count = n;
    if (!out || n > cap) return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *out) {
    (void)out;
    CHECK_DEVICE(d);
    *count = 0;
    return NVML_SUCCESS;
}

/* Events: critical Xids only, read from SIMNVML_XID_FILE. A set remembers
 * how far it has read the file and which devices are registered on it. */
#define EVENT_XID 8ull
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData;
                 unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
struct sim_event_set { long offset; unsigned registered; };
typedef struct sim_event_set *nvmlEventSet_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    delay();
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    *set = calloc(1, sizeof **set);
    /* Events from now on: what the file held before is history. */
    const char *path = getenv("SIMNVML_XID_FILE");
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) { fseek(f, 0, SEEK_END); (*set)->offset = ftell(f); fclose(f); }
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) { free(set); return NVML_SUCCESS; }
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    CHECK_DEVICE(d);
    *types = getenv("SIMNVML_XID_FILE") ? EVENT_XID : 0;
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    CHECK_DEVICE(d);
    if (!set || types & ~EVENT_XID || !getenv("SIMNVML_XID_FILE")) return NVML_ERROR_NOT_SUPPORTED;
    set->registered |= 1u << index_of(d);
    return NVML_SUCCESS;
}
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    const char *path = getenv("SIMNVML_XID_FILE");
    if (!set || !path) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned waited = 0;; waited += 10) {
        FILE *f = fopen(path, "r");
        if (f && fseek(f, set->offset, SEEK_SET) == 0) {
            unsigned dev, code;
            char line[64];
            while (fgets(line, sizeof line, f) && strchr(line, '\n')) {
                set->offset = ftell(f);
                if (sscanf(line, "%u %u", &dev, &code) != 2 || dev >= 32 || !(set->registered & (1u << dev))) continue;
                fclose(f);
                memset(data, 0, sizeof *data);
                data->device = (nvmlDevice_t)(uintptr_t)(dev + 1);
                data->eventType = EVENT_XID;
                data->eventData = code;
                data->gpuInstanceId = data->computeInstanceId = 0xffffffffu;
                return NVML_SUCCESS;
            }
        }
        if (f) fclose(f);
        if (waited >= timeout_ms) return NVML_ERROR_TIMEOUT;
        struct timespec ts = { 0, 10 * 1000000L };
        nanosleep(&ts, NULL);
    }
}
