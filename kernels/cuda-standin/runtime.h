/*
 * libcudart stand-in internals: the driver functions the runtime calls, found in
 * libcuda.so.1 at first use (as the real runtime does), and per-thread state.
 */
#ifndef CCLKIT_CUDA_STANDIN_RUNTIME_H
#define CCLKIT_CUDA_STANDIN_RUNTIME_H

#include "standin.h"

typedef int cudaError_t;
typedef CUstream cudaStream_t;
typedef CUevent cudaEvent_t;

enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorSymbolNotFound = 500,
  cudaErrorNotSupported = 801,
};

/* The driver as the runtime sees it; every pointer is set once drv() succeeded. */
typedef struct {
  CUresult (*Init)(unsigned int);
  CUresult (*DriverGetVersion)(int *);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
  CUresult (*DeviceGetPCIBusId)(char *, int, CUdevice);
  CUresult (*DeviceGetByPCIBusId)(CUdevice *, const char *);
  CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*CtxGetDevice)(CUdevice *);
  CUresult (*CtxSynchronize)(void);
  CUresult (*FlushGPUDirectRDMAWrites)(int, int);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemHostAlloc)(void **, size_t, unsigned int);
  CUresult (*MemFreeHost)(void *);
  CUresult (*MemHostRegister)(void *, size_t, unsigned int);
  CUresult (*MemHostUnregister)(void *);
  CUresult (*MemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned int);
  CUresult (*MemGetInfo)(size_t *, size_t *);
  CUresult (*Memcpy)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*PointerGetAttributes)(unsigned int, int *, void **, CUdeviceptr);
  CUresult (*StreamCreate)(CUstream *, unsigned int);
  CUresult (*StreamCreateWithPriority)(CUstream *, unsigned int, int);
  CUresult (*StreamDestroy)(CUstream);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*StreamQuery)(CUstream);
  CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
  CUresult (*StreamIsCapturing)(CUstream, int *);
  CUresult (*EventCreate)(CUevent *, unsigned int);
  CUresult (*EventDestroy)(CUevent);
  CUresult (*EventRecord)(CUevent, CUstream);
  CUresult (*EventSynchronize)(CUevent);
  CUresult (*EventQuery)(CUevent);
  CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
  CUresult (*ThreadExchangeStreamCaptureMode)(int *);
  CUresult (*GetProcAddress)(const char *, void **, int, cuuint64_t, int *);
} standin_driver;

/* The driver, loading and initialising it on first use; NULL with *err set when
 * there is none (cudaErrorInsufficientDriver, as the real runtime answers). */
STANDIN_HIDDEN const standin_driver *rt_driver(cudaError_t *err);
/* Records err as the thread's last error (unless success) and returns it. */
STANDIN_HIDDEN cudaError_t rt_result(cudaError_t err);
/* A driver result as a runtime result. */
STANDIN_HIDDEN cudaError_t rt_from_cu(CUresult r);
/* Makes the thread's device current in the driver (cudaSetDevice's context). */
STANDIN_HIDDEN cudaError_t rt_bind(const standin_driver *d);

/* Start of a runtime call that needs the driver: declares `d` or returns. */
#define RT_DRIVER(d)                                    \
  cudaError_t rt_err_ = cudaSuccess;                    \
  const standin_driver *d = rt_driver(&rt_err_);        \
  if (!d) return rt_result(rt_err_);                    \
  rt_err_ = rt_bind(d);                                 \
  if (rt_err_ != cudaSuccess) return rt_result(rt_err_)

#define RT_CALL(expr) rt_result(rt_from_cu(expr))

#define CUDA_VERSION_STANDIN 12040

#endif
