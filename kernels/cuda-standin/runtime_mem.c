/*
 * Runtime API memory, pointer queries, streams and events: each a thin layer over
 * the driver call of the same job, so the runtime and a plugin's own driver calls
 * see the same allocations.
 */
#include <string.h>

#include "runtime.h"

STANDIN_API cudaError_t cudaMalloc(void **p, size_t size) {
  RT_TRACE("cudaMalloc(%zu)", size);
  if (!p) return rt_result(cudaErrorInvalidValue);
  RT_DRIVER(d);
  CUdeviceptr dp = 0;
  CUresult r = d->MemAlloc(&dp, size);
  *p = (void *)(uintptr_t)dp;
  return r == CUDA_ERROR_OUT_OF_MEMORY ? rt_result(cudaErrorMemoryAllocation) : RT_CALL(r);
}

STANDIN_API cudaError_t cudaFree(void *p) {
  RT_TRACE("cudaFree(%p)", p);
  RT_DRIVER(d); /* cudaFree(NULL) is the usual "initialise the runtime" idiom */
  return RT_CALL(d->MemFree((CUdeviceptr)(uintptr_t)p));
}

STANDIN_API cudaError_t cudaHostAlloc(void **p, size_t size, unsigned int flags) {
  RT_TRACE("cudaHostAlloc(%zu, flags=%u)", size, flags);
  RT_DRIVER(d);
  return RT_CALL(d->MemHostAlloc(p, size, flags));
}

STANDIN_API cudaError_t cudaMallocHost(void **p, size_t size) { return cudaHostAlloc(p, size, 0); }

STANDIN_API cudaError_t cudaFreeHost(void *p) {
  RT_TRACE("cudaFreeHost(%p)", p);
  RT_DRIVER(d);
  return RT_CALL(d->MemFreeHost(p));
}

STANDIN_API cudaError_t cudaHostRegister(void *p, size_t size, unsigned int flags) {
  RT_TRACE("cudaHostRegister(%p, %zu, flags=%u)", p, size, flags);
  RT_DRIVER(d);
  return RT_CALL(d->MemHostRegister(p, size, flags));
}

STANDIN_API cudaError_t cudaHostUnregister(void *p) {
  RT_TRACE("cudaHostUnregister(%p)", p);
  RT_DRIVER(d);
  return RT_CALL(d->MemHostUnregister(p));
}

STANDIN_API cudaError_t cudaHostGetDevicePointer(void **dev, void *host, unsigned int flags) {
  RT_TRACE("cudaHostGetDevicePointer(%p)", host);
  if (!dev) return rt_result(cudaErrorInvalidValue);
  RT_DRIVER(d);
  CUdeviceptr dp = 0;
  cudaError_t e = RT_CALL(d->MemHostGetDevicePointer(&dp, host, flags));
  *dev = (void *)(uintptr_t)dp;
  return e;
}

STANDIN_API cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  RT_TRACE("cudaMemGetInfo()");
  RT_DRIVER(d);
  return RT_CALL(d->MemGetInfo(free_bytes, total));
}

/* cudaMemcpyKind: HostToHost 0, HostToDevice 1, DeviceToHost 2, DeviceToDevice 3,
 * Default 4 (inferred from the pointers). */
static cudaError_t copy(const standin_driver *d, void *dst, const void *src, size_t n, int kind) {
  CUdeviceptr dd = (CUdeviceptr)(uintptr_t)dst, sd = (CUdeviceptr)(uintptr_t)src;
  switch (kind) {
    case 0:
      if (n) memmove(dst, src, n);
      return cudaSuccess;
    case 1: return RT_CALL(d->MemcpyHtoD(dd, src, n));
    case 2: return RT_CALL(d->MemcpyDtoH(dst, sd, n));
    case 3: return RT_CALL(d->MemcpyDtoD(dd, sd, n));
    case 4: return RT_CALL(d->Memcpy(dd, sd, n));
    default: return rt_result(cudaErrorInvalidMemcpyDirection);
  }
}

STANDIN_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind) {
  RT_TRACE("cudaMemcpy(%p, %p, %zu, kind=%d)", dst, src, n, kind);
  RT_DRIVER(d);
  return copy(d, dst, src, n, kind);
}

STANDIN_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, cudaStream_t s) {
  RT_TRACE("cudaMemcpyAsync(%p, %p, %zu, kind=%d, stream=%p)", dst, src, n, kind, (void *)s);
  RT_DRIVER(d);
  return copy(d, dst, src, n, kind);
}

STANDIN_API cudaError_t cudaMemset(void *p, int value, size_t n) {
  RT_TRACE("cudaMemset(%p, %d, %zu)", p, value, n);
  RT_DRIVER(d);
  return RT_CALL(d->MemsetD8((CUdeviceptr)(uintptr_t)p, (unsigned char)value, n));
}

STANDIN_API cudaError_t cudaMemsetAsync(void *p, int value, size_t n, cudaStream_t s) {
  (void)s;
  return cudaMemset(p, value, n);
}

/* struct cudaPointerAttributes (CUDA 11+). cudaMemoryType: Unregistered 0, Host 1,
 * Device 2, Managed 3. */
struct cudaPointerAttributes {
  int type;
  int device;
  void *devicePointer;
  void *hostPointer;
};

STANDIN_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
  RT_TRACE("cudaPointerGetAttributes(%p)", p);
  if (!a) return rt_result(cudaErrorInvalidValue);
  RT_DRIVER(d);
  unsigned int type = 0;
  int ordinal = -2, managed = 0;
  int attrs[3] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                  CU_POINTER_ATTRIBUTE_IS_MANAGED};
  void *data[3] = {&type, &ordinal, &managed};
  cudaError_t e = RT_CALL(d->PointerGetAttributes(3, attrs, data, (CUdeviceptr)(uintptr_t)p));
  if (e != cudaSuccess) return e;
  /* CU_MEMORYTYPE_HOST/DEVICE are cudaMemoryTypeHost/Device; managed memory is 3. */
  a->type = managed ? 3 : (int)type;
  a->device = type ? ordinal : -2;
  a->devicePointer = type ? (void *)p : NULL;
  a->hostPointer = type == CU_MEMORYTYPE_DEVICE && !managed ? NULL : (void *)p;
  return cudaSuccess;
}

/* ---- streams and events ------------------------------------------------------------ */

STANDIN_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *s, unsigned int flags, int priority) {
  RT_TRACE("cudaStreamCreateWithPriority(flags=%u, priority=%d)", flags, priority);
  RT_DRIVER(d);
  return RT_CALL(d->StreamCreateWithPriority(s, flags, priority));
}

STANDIN_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  return cudaStreamCreateWithPriority(s, flags, 0);
}

STANDIN_API cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithPriority(s, 0, 0); }

STANDIN_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  RT_TRACE("cudaStreamDestroy(%p)", (void *)s);
  RT_DRIVER(d);
  return RT_CALL(d->StreamDestroy(s));
}

STANDIN_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  RT_TRACE("cudaStreamSynchronize(%p)", (void *)s);
  RT_DRIVER(d);
  return RT_CALL(d->StreamSynchronize(s));
}

STANDIN_API cudaError_t cudaStreamQuery(cudaStream_t s) {
  RT_TRACE("cudaStreamQuery(%p)", (void *)s);
  RT_DRIVER(d);
  return RT_CALL(d->StreamQuery(s));
}

STANDIN_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  RT_TRACE("cudaStreamWaitEvent(%p, %p)", (void *)s, (void *)e);
  RT_DRIVER(d);
  return RT_CALL(d->StreamWaitEvent(s, e, flags));
}

STANDIN_API cudaError_t cudaStreamIsCapturing(cudaStream_t s, int *status) {
  RT_TRACE("cudaStreamIsCapturing(%p)", (void *)s);
  RT_DRIVER(d);
  return RT_CALL(d->StreamIsCapturing(s, status));
}

STANDIN_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
  RT_TRACE("cudaEventCreateWithFlags(%u)", flags);
  RT_DRIVER(d);
  return RT_CALL(d->EventCreate(e, flags));
}

STANDIN_API cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

STANDIN_API cudaError_t cudaEventDestroy(cudaEvent_t e) {
  RT_TRACE("cudaEventDestroy(%p)", (void *)e);
  RT_DRIVER(d);
  return RT_CALL(d->EventDestroy(e));
}

STANDIN_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  RT_TRACE("cudaEventRecord(%p, %p)", (void *)e, (void *)s);
  RT_DRIVER(d);
  return RT_CALL(d->EventRecord(e, s));
}

STANDIN_API cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  RT_TRACE("cudaEventSynchronize(%p)", (void *)e);
  RT_DRIVER(d);
  return RT_CALL(d->EventSynchronize(e));
}

STANDIN_API cudaError_t cudaEventQuery(cudaEvent_t e) {
  RT_TRACE("cudaEventQuery(%p)", (void *)e);
  RT_DRIVER(d);
  return RT_CALL(d->EventQuery(e));
}

STANDIN_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  RT_TRACE("cudaEventElapsedTime(%p, %p)", (void *)a, (void *)b);
  RT_DRIVER(d);
  return RT_CALL(d->EventElapsedTime(ms, a, b));
}

STANDIN_API cudaError_t cudaThreadExchangeStreamCaptureMode(int *mode) {
  RT_TRACE("cudaThreadExchangeStreamCaptureMode(%d)", mode ? *mode : -1);
  RT_DRIVER(d);
  return RT_CALL(d->ThreadExchangeStreamCaptureMode(mode));
}

/* ---- device-code registration ------------------------------------------------------ */
/* A library built by nvcc registers its kernels from a constructor at load time.
 * Accepting the registration lets such a plugin load; launching a kernel then fails
 * by name (cudaLaunchKernel is unimplemented), since nothing here runs GPU code. */

static void *fatbin_handle;

STANDIN_API void **__cudaRegisterFatBinary(void *fatbin) {
  RT_TRACE("__cudaRegisterFatBinary(%p): kernels are accepted but cannot run", fatbin);
  return &fatbin_handle;
}
STANDIN_API void __cudaRegisterFatBinaryEnd(void **h) { (void)h; }
STANDIN_API void __cudaUnregisterFatBinary(void **h) { (void)h; }
STANDIN_API void __cudaRegisterFunction(void **h, const char *host_fn, char *device_fn, const char *name, int limit,
                                        void *tid, void *bid, void *bdim, void *gdim, int *wsize) {
  (void)h, (void)host_fn, (void)device_fn, (void)limit, (void)tid, (void)bid, (void)bdim, (void)gdim, (void)wsize;
  RT_TRACE("__cudaRegisterFunction(%s)", name ? name : "(null)");
}
STANDIN_API void __cudaRegisterVar(void **h, char *host_var, char *device_addr, const char *name, int ext,
                                   size_t size, int constant, int global) {
  (void)h, (void)host_var, (void)device_addr, (void)ext, (void)size, (void)constant, (void)global;
  RT_TRACE("__cudaRegisterVar(%s)", name ? name : "(null)");
}
