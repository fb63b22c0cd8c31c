/*
 * cclkit CUDA stand-in: declarations shared by libcuda.so.1 and libcudart.so.12.
 *
 * The types are written here from the documented CUDA C API (no CUDA toolkit is
 * needed to build): handles are pointers, CUdeviceptr is a 64-bit integer, enums
 * are plain ints. Only the values the stand-in answers are named.
 *
 * Everything here is host memory: "device" allocations are page-aligned host
 * allocations that the pointer queries report as device memory of the device
 * whose context was current when they were made.
 */
#ifndef CCLKIT_CUDA_STANDIN_H
#define CCLKIT_CUDA_STANDIN_H

#include <stddef.h>
#include <stdint.h>

#define STANDIN_API __attribute__((visibility("default")))
#define STANDIN_HIDDEN __attribute__((visibility("hidden")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct standin_ctx *CUcontext;
typedef struct standin_stream *CUstream;
typedef struct standin_event *CUevent;
typedef unsigned long long cuuint64_t;

/* CUresult values (cuda.h). */
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_MISALIGNED_ADDRESS = 716,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_UNKNOWN = 999,
};

/* CUpointer_attribute values the stand-in answers. */
enum {
  CU_POINTER_ATTRIBUTE_CONTEXT = 1,
  CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3,
  CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
  CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6,
  CU_POINTER_ATTRIBUTE_BUFFER_ID = 7,
  CU_POINTER_ATTRIBUTE_IS_MANAGED = 8,
  CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
  CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
  CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
  CU_POINTER_ATTRIBUTE_MAPPED = 13,
  CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES = 14,
  CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
};

/* CUmemorytype. */
enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2 };

/* One recorded allocation (memory.c). */
typedef struct {
  uintptr_t base;
  size_t size;
  int device;   /* ordinal of the device it belongs to */
  int type;     /* CU_MEMORYTYPE_DEVICE or CU_MEMORYTYPE_HOST */
  int owned;    /* 1: the stand-in allocated it (free it); 0: registered host memory */
  int managed;  /* cuMemAllocManaged memory (type DEVICE, also a host address) */
  uint64_t id;  /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
} standin_alloc;

/* common.c: tracing and the once-per-name report of unimplemented calls. */
STANDIN_HIDDEN int standin_tracing(void);
STANDIN_HIDDEN void standin_trace(const char *lib, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reports an unimplemented call (once per name); 1 when `name` was kept. */
STANDIN_HIDDEN int standin_missing(const char *lib, const char *name, int code, const char *code_name);
STANDIN_HIDDEN const char *standin_last_missing(void);
/* "stem(attribute n)", one lasting string per (stem, n), for standin_missing. */
STANDIN_HIDDEN const char *standin_numbered(const char *stem, int n);
STANDIN_HIDDEN int standin_env_int(const char *name, int fallback, int lo, int hi);

#define CU_TRACE(...) do { if (standin_tracing()) standin_trace("libcuda", __VA_ARGS__); } while (0)
#define RT_TRACE(...) do { if (standin_tracing()) standin_trace("libcudart", __VA_ARGS__); } while (0)

/* driver.c: state the other driver files use. */
STANDIN_HIDDEN int standin_initialized(void);
STANDIN_HIDDEN int standin_device_count(void);
STANDIN_HIDDEN int standin_current_device(void);
STANDIN_HIDDEN CUcontext standin_primary_ctx(int dev);

/* memory.c */
STANDIN_HIDDEN int standin_lookup(uintptr_t p, standin_alloc *out);
/* [p, p+n) lies inside one recorded allocation or registration (n may be 0). */
STANDIN_HIDDEN int standin_inside(uintptr_t p, size_t n);

/* streams.c: NULL, the two default-stream handles, or a live stream. */
STANDIN_HIDDEN int standin_valid_stream(CUstream s);

/* kernels/cuda/emulator.cpp: cclkit's own kernels compiled for the host (module.c). */
STANDIN_HIDDEN int cclkit_emul_launch(const char *entry, unsigned long long threads, void **params);
STANDIN_HIDDEN int cclkit_emul_signature(const char *entry, int *nparams, unsigned long long *elem_size);

/* procaddr.c: the driver function of an entry-point name, or NULL. */
STANDIN_HIDDEN void *standin_proc(const char *symbol);

#define CHECK_INIT() do { if (!standin_initialized()) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

#endif
