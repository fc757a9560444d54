/* Simulated CUDA driver (libcuda.so.1): see simcuda.h. */
#include "simcuda.h"
#include "simstate.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_DEVICES 8
#define MAGIC 0x51c0dau

struct header { struct header *prev, *next; size_t size; int device; unsigned magic; };
static struct header live = { &live, &live, 0, -1, 0 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t used[MAX_DEVICES];
static size_t capacity;
static int devices;
static __thread int current_device;
static uint64_t next_va = 0x7e0000000000ull;

static void init(void) {
    if (capacity) return;
    const char *c = getenv("SIMCUDA_DEVICE_MEM");
    const char *d = getenv("SIMCUDA_DEVICES");
    capacity = c ? strtoull(c, NULL, 0) : (16ull << 30);
    devices = d ? atoi(d) : 1;
    if (devices < 1 || devices > MAX_DEVICES) devices = 1;
}

/* With shared state (SIMCUDA_STATE), the device is full when every
 * process's charges together reach the capacity, as on a real GPU. */
static CUresult charge(int dev, size_t size) {
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&mu);
    init();
    struct sim_slot *slot = (dev >= 0 && dev < devices) ? sim_slot(getpid(), dev) : NULL;
    size_t in_use = slot ? sim_device_used(dev) : used[dev < 0 || dev >= devices ? 0 : dev];
    if (dev < 0 || dev >= devices) r = CUDA_ERROR_INVALID_DEVICE;
    else if (in_use + size > capacity) r = CUDA_ERROR_OUT_OF_MEMORY;
    else {
        used[dev] += size;
        if (slot) __atomic_add_fetch(&slot->bytes, size, __ATOMIC_ACQ_REL);
    }
    pthread_mutex_unlock(&mu);
    return r;
}

static void uncharge_locked(int dev, size_t size) {
    used[dev] -= size;
    struct sim_slot *slot = sim_slot(getpid(), dev);
    if (slot) __atomic_sub_fetch(&slot->bytes, size, __ATOMIC_ACQ_REL);
}

static void uncharge(int dev, size_t size) {
    pthread_mutex_lock(&mu);
    uncharge_locked(dev, size);
    pthread_mutex_unlock(&mu);
}

/* SIMCUDA_ALLOC_DELAY_MS: every device allocation takes this long, as a
 * real one may (read once; tests use it to hold calls open at once). */
static long alloc_delay_ms = -1;

/* Device memory: host memory behind a header that remembers the charge. */
static CUresult device_alloc(CUdeviceptr *dptr, size_t size, int touch) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    if (alloc_delay_ms < 0) {
        const char *d = getenv("SIMCUDA_ALLOC_DELAY_MS");
        alloc_delay_ms = d ? atol(d) : 0;
    }
    if (alloc_delay_ms > 0) {
        struct timespec t = { alloc_delay_ms / 1000, (alloc_delay_ms % 1000) * 1000000 };
        nanosleep(&t, NULL);
    }
    int dev = current_device;
    CUresult r = charge(dev, size);
    if (r) return r;
    struct header *h = malloc(sizeof *h + (size ? size : 1));
    if (!h) { uncharge(dev, size); return CUDA_ERROR_OUT_OF_MEMORY; }
    h->size = size; h->device = dev; h->magic = MAGIC;
    pthread_mutex_lock(&mu);
    h->prev = live.prev; h->next = &live; live.prev->next = h; live.prev = h;
    pthread_mutex_unlock(&mu);
    if (touch) memset(h + 1, 0, size);
    *dptr = (CUdeviceptr)(uintptr_t)(h + 1);
    return CUDA_SUCCESS;
}

static CUresult device_free(CUdeviceptr p) {
    if (!p) return CUDA_SUCCESS;
    struct header *h = (struct header *)(uintptr_t)p - 1;
    if (h->magic != MAGIC) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    h->magic = 0;
    h->prev->next = h->next; h->next->prev = h->prev;
    uncharge_locked(h->device, h->size);
    pthread_mutex_unlock(&mu);
    free(h);
    return CUDA_SUCCESS;
}

CUresult cuInit(unsigned flags) { (void)flags; pthread_mutex_lock(&mu); init(); pthread_mutex_unlock(&mu); return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) { return device_alloc(dptr, size, 0); }
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags) { (void)flags; return device_alloc(dptr, size, 0); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem) {
    (void)elem;
    if (!pitch) return CUDA_ERROR_INVALID_VALUE;
    size_t p = (width + 511) & ~(size_t)511;
    CUresult r = device_alloc(dptr, p * height, 0);
    if (!r) *pitch = p;
    return r;
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s) { (void)s; return device_alloc(dptr, size, 0); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s) { (void)pool; (void)s; return device_alloc(dptr, size, 0); }
/* Pinned host memory is real, resident host memory. */
CUresult cuMemAllocHost_v2(void **pp, size_t size) {
    if (!pp) return CUDA_ERROR_INVALID_VALUE;
    void *p = malloc(size ? size : 1);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    memset(p, 1, size);
    *pp = p;
    return CUDA_SUCCESS;
}
CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags) { (void)flags; return cuMemAllocHost_v2(pp, size); }
CUresult cuMemFree_v2(CUdeviceptr dptr) { return device_free(dptr); }
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s) { (void)s; return device_free(dptr); }
CUresult cuMemFreeHost(void *p) { free(p); return CUDA_SUCCESS; }

/* Virtual memory management: physical handles are charged; mappings are not. */
struct handle { size_t size; int device; unsigned magic; };
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags) {
    (void)flags;
    if (!h || !prop) return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    CUresult r = charge(dev, size);
    if (r) return r;
    struct handle *x = malloc(sizeof *x);
    x->size = size; x->device = dev; x->magic = MAGIC;
    *h = (CUmemGenericAllocationHandle)(uintptr_t)x;
    return CUDA_SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    struct handle *x = (struct handle *)(uintptr_t)h;
    if (!x || x->magic != MAGIC) return CUDA_ERROR_INVALID_VALUE;
    x->magic = 0;
    uncharge(x->device, x->size);
    free(x);
    return CUDA_SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags) {
    (void)align; (void)addr; (void)flags;
    if (!ptr) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&mu);
    *ptr = next_va;
    next_va += (size + 0xfffff) & ~0xfffffull;
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) { (void)ptr; (void)size; return CUDA_SUCCESS; }
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    (void)ptr; (void)size; (void)offset; (void)flags;
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) { (void)ptr; (void)size; return CUDA_SUCCESS; }

/* Contexts: the primary context of device d is the fake pointer (d+1)<<12. */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    pthread_mutex_lock(&mu); init(); int n = devices; pthread_mutex_unlock(&mu);
    if (!pctx || dev < 0 || dev >= n) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = (CUcontext)(uintptr_t)((dev + 1) << 12);
    return CUDA_SUCCESS;
}
CUresult cuCtxSetCurrent(CUcontext ctx) {
    uintptr_t v = (uintptr_t)ctx;
    if (!v || (v & 0xfff)) return CUDA_ERROR_INVALID_VALUE;
    current_device = (int)(v >> 12) - 1;
    return CUDA_SUCCESS;
}

/* Resetting a device's primary context frees everything allocated in it. */
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    pthread_mutex_lock(&mu);
    init();
    if (dev < 0 || dev >= devices) { pthread_mutex_unlock(&mu); return CUDA_ERROR_INVALID_DEVICE; }
    for (struct header *h = live.next, *next; h != &live; h = next) {
        next = h->next;
        if (h->device != dev) continue;
        h->prev->next = h->next; h->next->prev = h->prev;
        uncharge_locked(dev, h->size);
        h->magic = 0;
        free(h);
    }
    pthread_mutex_unlock(&mu);
    return CUDA_SUCCESS;
}
