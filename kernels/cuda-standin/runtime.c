/*
 * Runtime API (libcudart.so.12): initialisation, devices, versions, errors and
 * driver entry points. Memory, streams and events are in runtime_mem.c.
 *
 * Like the real runtime, this library does not link the driver: it dlopens
 * libcuda.so.1 at the first call that needs a device. Without a driver on the
 * library path every such call fails with cudaErrorInsufficientDriver, which is
 * what a plugin meets on a machine with the CUDA runtime but no GPU driver, and
 * cudaDriverGetVersion reports 0. With the stand-in's libcuda.so.1 first on the
 * path, runtime and driver share one set of devices, contexts and allocations.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "runtime.h"

static standin_driver driver;
static cudaError_t driver_error = cudaSuccess;
static int ndevices;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static __thread cudaError_t last_error;
static __thread int device;       /* the thread's device (cudaSetDevice) */
static __thread int device_bound; /* its context was made current in the driver */

static void *need(void *lib, const char *name, int *missing) {
  void *f = dlsym(lib, name);
  if (!f) {
    fprintf(stderr, "cclkit cuda-standin libcudart: the driver lacks %s\n", name);
    *missing = 1;
  }
  return f;
}

static void load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    if (standin_tracing()) RT_TRACE("no CUDA driver: %s", dlerror());
    driver_error = cudaErrorInsufficientDriver;
    return;
  }
  int missing = 0;
#define GET(field, name) *(void **)&driver.field = need(lib, name, &missing)
  GET(Init, "cuInit");
  GET(DriverGetVersion, "cuDriverGetVersion");
  GET(DeviceGetCount, "cuDeviceGetCount");
  GET(DeviceGetAttribute, "cuDeviceGetAttribute");
  GET(DeviceGetPCIBusId, "cuDeviceGetPCIBusId");
  GET(DeviceGetByPCIBusId, "cuDeviceGetByPCIBusId");
  GET(DeviceCanAccessPeer, "cuDeviceCanAccessPeer");
  GET(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  GET(CtxSetCurrent, "cuCtxSetCurrent");
  GET(CtxGetDevice, "cuCtxGetDevice");
  GET(CtxSynchronize, "cuCtxSynchronize");
  GET(FlushGPUDirectRDMAWrites, "cuFlushGPUDirectRDMAWrites");
  GET(MemAlloc, "cuMemAlloc_v2");
  GET(MemFree, "cuMemFree_v2");
  GET(MemHostAlloc, "cuMemHostAlloc");
  GET(MemFreeHost, "cuMemFreeHost");
  GET(MemHostRegister, "cuMemHostRegister_v2");
  GET(MemHostUnregister, "cuMemHostUnregister");
  GET(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2");
  GET(MemGetInfo, "cuMemGetInfo_v2");
  GET(Memcpy, "cuMemcpy");
  GET(MemcpyHtoD, "cuMemcpyHtoD_v2");
  GET(MemcpyDtoH, "cuMemcpyDtoH_v2");
  GET(MemcpyDtoD, "cuMemcpyDtoD_v2");
  GET(MemsetD8, "cuMemsetD8_v2");
  GET(PointerGetAttributes, "cuPointerGetAttributes");
  GET(StreamCreate, "cuStreamCreate");
  GET(StreamCreateWithPriority, "cuStreamCreateWithPriority");
  GET(StreamDestroy, "cuStreamDestroy_v2");
  GET(StreamSynchronize, "cuStreamSynchronize");
  GET(StreamQuery, "cuStreamQuery");
  GET(StreamWaitEvent, "cuStreamWaitEvent");
  GET(StreamIsCapturing, "cuStreamIsCapturing");
  GET(EventCreate, "cuEventCreate");
  GET(EventDestroy, "cuEventDestroy_v2");
  GET(EventRecord, "cuEventRecord");
  GET(EventSynchronize, "cuEventSynchronize");
  GET(EventQuery, "cuEventQuery");
  GET(EventElapsedTime, "cuEventElapsedTime");
  GET(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
  GET(GetProcAddress, "cuGetProcAddress_v2");
#undef GET
  if (missing) {
    driver_error = cudaErrorInsufficientDriver;
    return;
  }
  CUresult r = driver.Init(0);
  if (r == CUDA_SUCCESS) r = driver.DeviceGetCount(&ndevices);
  if (r != CUDA_SUCCESS) driver_error = r == CUDA_ERROR_NO_DEVICE ? cudaErrorNoDevice : cudaErrorInitializationError;
  else if (ndevices == 0) driver_error = cudaErrorNoDevice;
}

const standin_driver *rt_driver(cudaError_t *err) {
  pthread_once(&once, load);
  if (driver_error != cudaSuccess) {
    *err = driver_error;
    return NULL;
  }
  return &driver;
}

cudaError_t rt_result(cudaError_t err) {
  if (err != cudaSuccess) last_error = err;
  return err;
}

cudaError_t rt_from_cu(CUresult r) {
  /* The runtime's numbers agree with the driver's for every code the stand-in
   * driver returns (invalid value, out of memory, invalid device, handle, not
   * found, not ready, not supported); only "not initialised" differs in meaning. */
  return r == CUDA_ERROR_NOT_INITIALIZED ? cudaErrorInitializationError : r;
}

cudaError_t rt_bind(const standin_driver *d) {
  if (device_bound) return cudaSuccess;
  CUcontext ctx = NULL;
  CUresult r = d->DevicePrimaryCtxRetain(&ctx, device);
  if (r == CUDA_SUCCESS) r = d->CtxSetCurrent(ctx);
  if (r != CUDA_SUCCESS) return rt_from_cu(r);
  device_bound = 1;
  return cudaSuccess;
}

STANDIN_API cudaError_t cudaDriverGetVersion(int *version) {
  RT_TRACE("cudaDriverGetVersion()");
  if (!version) return rt_result(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  const standin_driver *d = rt_driver(&err);
  if (!d) {
    *version = 0; /* documented answer when no driver is installed */
    return cudaSuccess;
  }
  return RT_CALL(d->DriverGetVersion(version));
}

STANDIN_API cudaError_t cudaRuntimeGetVersion(int *version) {
  RT_TRACE("cudaRuntimeGetVersion() = %d", CUDA_VERSION_STANDIN);
  if (!version) return rt_result(cudaErrorInvalidValue);
  *version = CUDA_VERSION_STANDIN;
  return cudaSuccess;
}

STANDIN_API cudaError_t cudaGetDeviceCount(int *count) {
  RT_TRACE("cudaGetDeviceCount()");
  if (!count) return rt_result(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  if (!rt_driver(&err)) {
    *count = 0;
    return rt_result(err);
  }
  *count = ndevices;
  return cudaSuccess;
}

STANDIN_API cudaError_t cudaSetDevice(int dev) {
  RT_TRACE("cudaSetDevice(%d)", dev);
  cudaError_t err = cudaSuccess;
  const standin_driver *d = rt_driver(&err);
  if (!d) return rt_result(err);
  if (dev < 0 || dev >= ndevices) return rt_result(cudaErrorInvalidDevice);
  device = dev;
  device_bound = 0;
  return rt_result(rt_bind(d));
}

STANDIN_API cudaError_t cudaGetDevice(int *dev) {
  RT_TRACE("cudaGetDevice()");
  if (!dev) return rt_result(cudaErrorInvalidValue);
  RT_DRIVER(d);
  return RT_CALL(d->CtxGetDevice(dev));
}

STANDIN_API cudaError_t cudaSetDeviceFlags(unsigned int flags) {
  RT_TRACE("cudaSetDeviceFlags(%u)", flags);
  RT_DRIVER(d);
  (void)d;
  return cudaSuccess;
}

STANDIN_API cudaError_t cudaDeviceGetAttribute(int *value, int attr, int dev) {
  RT_TRACE("cudaDeviceGetAttribute(attr=%d, dev=%d)", attr, dev);
  RT_DRIVER(d);
  return RT_CALL(d->DeviceGetAttribute(value, attr, dev));
}

STANDIN_API cudaError_t cudaDeviceGetPCIBusId(char *bus, int len, int dev) {
  RT_TRACE("cudaDeviceGetPCIBusId(dev=%d)", dev);
  RT_DRIVER(d);
  return RT_CALL(d->DeviceGetPCIBusId(bus, len, dev));
}

STANDIN_API cudaError_t cudaDeviceGetByPCIBusId(int *dev, const char *bus) {
  RT_TRACE("cudaDeviceGetByPCIBusId(%s)", bus ? bus : "(null)");
  RT_DRIVER(d);
  return RT_CALL(d->DeviceGetByPCIBusId(dev, bus));
}

STANDIN_API cudaError_t cudaDeviceCanAccessPeer(int *can, int dev, int peer) {
  RT_TRACE("cudaDeviceCanAccessPeer(%d, %d)", dev, peer);
  RT_DRIVER(d);
  return RT_CALL(d->DeviceCanAccessPeer(can, dev, peer));
}

STANDIN_API cudaError_t cudaDeviceSynchronize(void) {
  RT_TRACE("cudaDeviceSynchronize()");
  RT_DRIVER(d);
  return RT_CALL(d->CtxSynchronize());
}

/* CUDA 11.3+: the runtime's GPUDirect RDMA write flush (aws-ofi-nccl links it). The
 * target and scope enums have the driver's values (current device 0; to owner 100,
 * to all devices 200), so the call goes straight through. */
STANDIN_API cudaError_t cudaDeviceFlushGPUDirectRDMAWrites(int target, int scope) {
  RT_TRACE("cudaDeviceFlushGPUDirectRDMAWrites(target=%d, scope=%d)", target, scope);
  RT_DRIVER(d);
  return RT_CALL(d->FlushGPUDirectRDMAWrites(target, scope));
}

/* ---- errors ---------------------------------------------------------------------- */

STANDIN_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  RT_TRACE("cudaGetLastError() = %d", e);
  last_error = cudaSuccess;
  return e;
}

STANDIN_API cudaError_t cudaPeekAtLastError(void) {
  RT_TRACE("cudaPeekAtLastError() = %d", last_error);
  return last_error;
}

static const struct { int code; const char *name, *text; } errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {201, "cudaErrorDeviceUninitialized", "invalid device context"},
    {400, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {600, "cudaErrorNotReady", "device not ready"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {999, "cudaErrorUnknown", "unknown error"},
};

STANDIN_API const char *cudaGetErrorName(cudaError_t e) {
  RT_TRACE("cudaGetErrorName(%d)", e);
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == e) return errors[i].name;
  return "cudaErrorUnknown";
}

STANDIN_API const char *cudaGetErrorString(cudaError_t e) {
  RT_TRACE("cudaGetErrorString(%d)", e);
  if (e == cudaErrorNotSupported && standin_last_missing()) {
    /* Names the call the stand-in lacks in whatever the plugin logs. */
    static char text[160];
    snprintf(text, sizeof text, "operation not supported (cclkit CUDA stand-in: %s is not implemented)",
             standin_last_missing());
    return text;
  }
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == e) return errors[i].text;
  return "unrecognized error code";
}

/* ---- driver entry points ------------------------------------------------------------ */

/* cudaDriverEntryPointQueryResult: Success 0, SymbolNotFound 1. */
static cudaError_t entry_point(const char *symbol, void **fn, int version, unsigned long long flags,
                               int *status) {
  if (!symbol || !fn) return rt_result(cudaErrorInvalidValue);
  cudaError_t err = cudaSuccess;
  const standin_driver *d = rt_driver(&err);
  if (!d) {
    *fn = NULL;
    if (status) *status = 1;
    return rt_result(err);
  }
  int st = 1;
  CUresult r = d->GetProcAddress(symbol, fn, version, flags, &st);
  if (status) *status = st;
  /* An error, never success with a NULL function: a plugin that checks only the
   * return code must not go on to call through NULL. */
  if (r != CUDA_SUCCESS || !*fn) return rt_result(cudaErrorSymbolNotFound);
  return cudaSuccess;
}

STANDIN_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **fn, unsigned long long flags,
                                                int *status) {
  RT_TRACE("cudaGetDriverEntryPoint(\"%s\", flags=%llu)", symbol ? symbol : "(null)", flags);
  return entry_point(symbol, fn, CUDA_VERSION_STANDIN, flags, status);
}

STANDIN_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int version,
                                                         unsigned long long flags, int *status) {
  RT_TRACE("cudaGetDriverEntryPointByVersion(\"%s\", version=%u, flags=%llu)", symbol ? symbol : "(null)",
           version, flags);
  return entry_point(symbol, fn, (int)version, flags, status);
}
