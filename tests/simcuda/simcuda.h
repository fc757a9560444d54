/* Simulated CUDA driver and runtime for tracer's tests: the real C symbols
 * of the allocation APIs tracer probes, backed by host memory, with a
 * device capacity (SIMCUDA_DEVICE_MEM bytes, default 16 GiB, per device;
 * SIMCUDA_DEVICES devices, default 1) past which allocations fail with
 * out-of-memory (2), as a full GPU would. */
#ifndef SIMCUDA_H
#define SIMCUDA_H
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef struct {
    int type;
    int requestedHandleTypes;
    struct { int type; int id; } location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage; unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_INVALID_DEVICE 101

CUresult cuInit(unsigned flags);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned flags);
CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem);
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream s);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream s);
CUresult cuMemAllocHost_v2(void **pp, size_t size);
CUresult cuMemHostAlloc(void **pp, size_t size, unsigned flags);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream s);
CUresult cuMemFreeHost(void *p);
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle h);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev);

int cudaMalloc(void **p, size_t size);
int cudaMallocManaged(void **p, size_t size, unsigned flags);
int cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height);
int cudaMallocAsync(void **p, size_t size, void *stream);
int cudaMallocFromPoolAsync(void **p, size_t size, void *pool, void *stream);
int cudaMallocHost(void **p, size_t size);
int cudaHostAlloc(void **p, size_t size, unsigned flags);
int cudaFree(void *p);
int cudaFreeAsync(void *p, void *stream);
int cudaFreeHost(void *p);
int cudaSetDevice(int dev);
int cudaDeviceReset(void);
#endif
