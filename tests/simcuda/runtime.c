/* Simulated CUDA runtime (libcudart.so.12): each call goes through the
 * driver, as the real runtime's does, so a runtime call nests driver calls.
 * Built as a shared object it loads libcuda.so.1 from its own directory;
 * built with -DSIMCUDA_STATIC it calls the driver linked beside it. */
#define _GNU_SOURCE
#include "simcuda.h"
#include <stddef.h>

#ifdef SIMCUDA_STATIC
#define DRV(name) name
static int driver(void) { return 1; }
#else
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct {
    CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemAllocHost_v2)(void **, size_t);
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult (*cuMemFree_v2)(CUdeviceptr);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuMemFreeHost)(void *);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuDevicePrimaryCtxReset_v2)(CUdevice);
} drv;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int loaded;

static void load(void) {
    Dl_info me;
    char path[4096] = "libcuda.so.1";
    if (dladdr((void *)&load, &me) && me.dli_fname) {
        const char *slash = strrchr(me.dli_fname, '/');
        if (slash) snprintf(path, sizeof path, "%.*s/libcuda.so.1", (int)(slash - me.dli_fname), me.dli_fname);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
#define LOAD(f) *(void **)&drv.f = dlsym(h, #f)
    LOAD(cuMemAlloc_v2); LOAD(cuMemAllocManaged); LOAD(cuMemAllocPitch_v2); LOAD(cuMemAllocAsync);
    LOAD(cuMemAllocFromPoolAsync); LOAD(cuMemAllocHost_v2); LOAD(cuMemHostAlloc); LOAD(cuMemFree_v2);
    LOAD(cuMemFreeAsync); LOAD(cuMemFreeHost); LOAD(cuCtxSetCurrent); LOAD(cuDevicePrimaryCtxRetain); LOAD(cuDevicePrimaryCtxReset_v2);
    loaded = drv.cuMemAlloc_v2 != NULL;
}
static int driver(void) { pthread_once(&once, load); return loaded; }
#define DRV(name) drv.name
#endif

/* cudaErrorInsufficientDriver, as the real runtime returns without a driver. */
#define NO_DRIVER 35
#define RT(call) do { if (!driver()) return NO_DRIVER; return (call); } while (0)

int cudaMalloc(void **p, size_t size) { RT(DRV(cuMemAlloc_v2)((CUdeviceptr *)p, size)); }
int cudaMallocManaged(void **p, size_t size, unsigned flags) { RT(DRV(cuMemAllocManaged)((CUdeviceptr *)p, size, flags)); }
int cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height) { RT(DRV(cuMemAllocPitch_v2)((CUdeviceptr *)p, pitch, width, height, 4)); }
int cudaMallocAsync(void **p, size_t size, void *stream) { RT(DRV(cuMemAllocAsync)((CUdeviceptr *)p, size, stream)); }
int cudaMallocFromPoolAsync(void **p, size_t size, void *pool, void *stream) { RT(DRV(cuMemAllocFromPoolAsync)((CUdeviceptr *)p, size, pool, stream)); }
int cudaMallocHost(void **p, size_t size) { RT(DRV(cuMemAllocHost_v2)(p, size)); }
int cudaHostAlloc(void **p, size_t size, unsigned flags) { RT(DRV(cuMemHostAlloc)(p, size, flags)); }
int cudaFree(void *p) { RT(DRV(cuMemFree_v2)((CUdeviceptr)p)); }
int cudaFreeAsync(void *p, void *stream) { RT(DRV(cuMemFreeAsync)((CUdeviceptr)p, stream)); }
int cudaFreeHost(void *p) { RT(DRV(cuMemFreeHost)(p)); }
static __thread int current_device;
int cudaSetDevice(int dev) {
    if (!driver()) return NO_DRIVER;
    CUcontext ctx;
    if (DRV(cuDevicePrimaryCtxRetain)(&ctx, dev)) return 101; /* cudaErrorInvalidDevice */
    int r = DRV(cuCtxSetCurrent)(ctx);
    if (!r) current_device = dev;
    return r;
}
int cudaDeviceReset(void) { RT(DRV(cuDevicePrimaryCtxReset_v2)(current_device)); }
