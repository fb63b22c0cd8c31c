/*
 * Driver API memory: allocations, registered host memory, pointer queries, copies.
 *
 * "Device" memory is host memory aligned to 64 KiB (the GPU page size GPUDirect RDMA
 * pins), filled with 0xcb so a plugin that reads a buffer before anything was written
 * to it does not see zeros by luck. Every allocation and registration is recorded;
 * the pointer queries answer from that record, so a plugin's check "is this a device
 * pointer, of which device" gives the answer it would on a GPU. Copies check that
 * their device side lies inside a recorded range, as the driver does.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

#define ALIGN (64u << 10)

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static standin_alloc *allocs;
static size_t n_allocs, cap_allocs;
static uint64_t next_id = 1;

static int record_as(uintptr_t base, size_t size, int device, int type, int owned, int managed) {
  pthread_mutex_lock(&lock);
  if (n_allocs == cap_allocs) {
    size_t cap = cap_allocs ? cap_allocs * 2 : 64;
    standin_alloc *grown = realloc(allocs, cap * sizeof *grown);
    if (!grown) {
      pthread_mutex_unlock(&lock);
      return 0;
    }
    allocs = grown;
    cap_allocs = cap;
  }
  allocs[n_allocs++] = (standin_alloc){base, size, device, type, owned, managed, next_id++};
  pthread_mutex_unlock(&lock);
  return 1;
}

static int record(uintptr_t base, size_t size, int device, int type, int owned) {
  return record_as(base, size, device, type, owned, 0);
}

/* Removes the record starting at base with the given type; 1 if there was one. */
static int forget(uintptr_t base, int type, standin_alloc *out) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_allocs; i++) {
    if (allocs[i].base == base && allocs[i].type == type) {
      *out = allocs[i];
      allocs[i] = allocs[--n_allocs];
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

int standin_lookup(uintptr_t p, standin_alloc *out) {
  int found = 0;
  pthread_mutex_lock(&lock);
  for (size_t i = 0; i < n_allocs; i++) {
    if (p >= allocs[i].base && p - allocs[i].base < allocs[i].size) {
      *out = allocs[i];
      found = 1;
      break;
    }
  }
  pthread_mutex_unlock(&lock);
  return found;
}

int standin_inside(uintptr_t p, size_t n) {
  standin_alloc a;
  if (!standin_lookup(p, &a)) return 0;
  return n <= a.size - (p - a.base);
}

static void *host_alloc(size_t size) {
  void *p = NULL;
  if (posix_memalign(&p, ALIGN, size ? size : 1) != 0) return NULL;
  memset(p, 0xcb, size);
  return p;
}

STANDIN_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  CHECK_INIT();
  if (!dptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  void *p = host_alloc(size);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!record((uintptr_t)p, size, standin_current_device(), CU_MEMORYTYPE_DEVICE, 1)) {
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = (CUdeviceptr)(uintptr_t)p;
  CU_TRACE("cuMemAlloc_v2(%zu) = %p on device %d", size, p, standin_current_device());
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
  CU_TRACE("cuMemFree_v2(%p)", (void *)(uintptr_t)dptr);
  CHECK_INIT();
  if (dptr == 0) return CUDA_SUCCESS;
  standin_alloc a;
  if (!forget((uintptr_t)dptr, CU_MEMORYTYPE_DEVICE, &a)) return CUDA_ERROR_INVALID_VALUE;
  free((void *)a.base);
  return CUDA_SUCCESS;
}

/* Managed memory is one address for the host and the device: here that is simply
 * host memory, recorded as device memory with the managed flag (what the pointer
 * queries of a GPU report for it). */
STANDIN_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags) {
  CHECK_INIT();
  /* CU_MEM_ATTACH_GLOBAL (1) or CU_MEM_ATTACH_HOST (2), as the driver requires. */
  if (!dptr || size == 0 || (flags != 1 && flags != 2)) return CUDA_ERROR_INVALID_VALUE;
  void *p = host_alloc(size);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!record_as((uintptr_t)p, size, standin_current_device(), CU_MEMORYTYPE_DEVICE, 1, 1)) {
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = (CUdeviceptr)(uintptr_t)p;
  CU_TRACE("cuMemAllocManaged(%zu, flags=%u) = %p on device %d", size, flags, p, standin_current_device());
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr) {
  CU_TRACE("cuMemGetAddressRange_v2(%p)", (void *)(uintptr_t)dptr);
  CHECK_INIT();
  standin_alloc a;
  if (!standin_lookup((uintptr_t)dptr, &a) || a.type != CU_MEMORYTYPE_DEVICE) return CUDA_ERROR_NOT_FOUND;
  if (base) *base = a.base;
  if (size) *size = a.size;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemAlloc(CUdeviceptr *d, size_t s) { return cuMemAlloc_v2(d, s); }
STANDIN_API CUresult cuMemFree(CUdeviceptr d) { return cuMemFree_v2(d); }
STANDIN_API CUresult cuMemGetAddressRange(CUdeviceptr *b, size_t *s, CUdeviceptr d) {
  return cuMemGetAddressRange_v2(b, s, d);
}

STANDIN_API CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
  CU_TRACE("cuMemHostAlloc(%zu, flags=%u)", size, flags);
  CHECK_INIT();
  if (!pp || size == 0) return CUDA_ERROR_INVALID_VALUE;
  void *p = host_alloc(size);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!record((uintptr_t)p, size, standin_current_device(), CU_MEMORYTYPE_HOST, 1)) {
    free(p);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *pp = p;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemAllocHost_v2(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }
STANDIN_API CUresult cuMemAllocHost(void **pp, size_t size) { return cuMemHostAlloc(pp, size, 0); }

STANDIN_API CUresult cuMemFreeHost(void *p) {
  CU_TRACE("cuMemFreeHost(%p)", p);
  CHECK_INIT();
  standin_alloc a;
  if (!forget((uintptr_t)p, CU_MEMORYTYPE_HOST, &a) || !a.owned) return CUDA_ERROR_INVALID_VALUE;
  free(p);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags) {
  CU_TRACE("cuMemHostRegister_v2(%p, %zu, flags=%u)", p, size, flags);
  CHECK_INIT();
  if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
  standin_alloc a;
  if (standin_lookup((uintptr_t)p, &a)) return CUDA_ERROR_INVALID_VALUE; /* HOST_MEMORY_ALREADY_REGISTERED */
  return record((uintptr_t)p, size, standin_current_device(), CU_MEMORYTYPE_HOST, 0) ? CUDA_SUCCESS
                                                                                      : CUDA_ERROR_OUT_OF_MEMORY;
}

STANDIN_API CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) {
  return cuMemHostRegister_v2(p, size, flags);
}

STANDIN_API CUresult cuMemHostUnregister(void *p) {
  CU_TRACE("cuMemHostUnregister(%p)", p);
  CHECK_INIT();
  standin_alloc a;
  if (!forget((uintptr_t)p, CU_MEMORYTYPE_HOST, &a)) return CUDA_ERROR_INVALID_VALUE;
  if (a.owned) { /* cuMemHostAlloc memory is freed with cuMemFreeHost, not unregistered */
    record(a.base, a.size, a.device, a.type, a.owned);
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned int flags) {
  CU_TRACE("cuMemHostGetDevicePointer_v2(%p)", p);
  CHECK_INIT();
  if (!d || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  standin_alloc a;
  if (!standin_lookup((uintptr_t)p, &a) || a.type != CU_MEMORYTYPE_HOST) return CUDA_ERROR_INVALID_VALUE;
  *d = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  CU_TRACE("cuMemGetInfo_v2()");
  CHECK_INIT();
  if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
  *total = (size_t)80 << 30;
  *free_bytes = (size_t)79 << 30;
  return CUDA_SUCCESS;
}

/* ---- pointer queries ------------------------------------------------------------ */

/* Writes one attribute of ptr; known = ptr lies in a recorded range. */
static CUresult pointer_attribute(void *data, int attr, uintptr_t ptr, int known, const standin_alloc *a) {
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *(CUcontext *)data = known ? standin_primary_ctx(a->device) : NULL;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned int *)data = known ? (unsigned int)a->type : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      *(CUdeviceptr *)data = known ? ptr : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      /* Device memory has no host mapping on a GPU: report none, as the driver does. */
      *(void **)data = known && (a->type == CU_MEMORYTYPE_HOST || a->managed) ? (void *)ptr : NULL;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
      *(int *)data = 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
      *(int *)data = known && a->managed;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
      *(int *)data = known && a->type == CU_MEMORYTYPE_DEVICE && !a->managed;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
      *(int *)data = known && a->type == CU_MEMORYTYPE_DEVICE && !a->managed && standin_env_int("CCLKIT_CUDA_STANDIN_GDR", 0, 0, 1);
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
      *(unsigned long long *)data = known ? a->id : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
      *(int *)data = known ? a->device : -2;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *(CUdeviceptr *)data = known ? a->base : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
      *(size_t *)data = known ? a->size : 0;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_MAPPED:
      *(int *)data = known;
      return CUDA_SUCCESS;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
      *(unsigned long long *)data = 0;
      return CUDA_SUCCESS;
    default: {
      standin_missing("libcuda", standin_numbered("cuPointerGetAttribute", attr), CUDA_ERROR_INVALID_VALUE,
                      "CUDA_ERROR_INVALID_VALUE");
      return CUDA_ERROR_INVALID_VALUE;
    }
  }
}

STANDIN_API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr ptr) {
  CHECK_INIT();
  if (!data) return CUDA_ERROR_INVALID_VALUE;
  standin_alloc a;
  int known = standin_lookup((uintptr_t)ptr, &a);
  CU_TRACE("cuPointerGetAttribute(attr=%d, %p): %s", attr, (void *)(uintptr_t)ptr,
           !known ? "not CUDA memory" : a.type == CU_MEMORYTYPE_DEVICE ? "device memory" : "host memory");
  /* Unlike the plural form, the single query fails for memory CUDA does not know. */
  if (!known) return CUDA_ERROR_INVALID_VALUE;
  return pointer_attribute(data, attr, (uintptr_t)ptr, 1, &a);
}

STANDIN_API CUresult cuPointerGetAttributes(unsigned int n, int *attrs, void **data, CUdeviceptr ptr) {
  CHECK_INIT();
  if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
  standin_alloc a;
  int known = standin_lookup((uintptr_t)ptr, &a);
  CU_TRACE("cuPointerGetAttributes(n=%u, %p): %s", n, (void *)(uintptr_t)ptr,
           !known ? "not CUDA memory" : a.type == CU_MEMORYTYPE_DEVICE ? "device memory" : "host memory");
  for (unsigned int i = 0; i < n; i++) {
    if (!data[i]) continue;
    CUresult rc = pointer_attribute(data[i], attrs[i], (uintptr_t)ptr, known, &a);
    if (rc != CUDA_SUCCESS) return rc;
  }
  return CUDA_SUCCESS;
}

/* ---- copies and sets: synchronous, device sides checked ------------------------- */

static CUresult copy(const char *name, uintptr_t dst, int dst_dev, uintptr_t src, int src_dev, size_t n) {
  CU_TRACE("%s(dst=%p, src=%p, %zu)", name, (void *)dst, (void *)src, n);
  CHECK_INIT();
  if (n == 0) return CUDA_SUCCESS;
  if ((dst_dev && !standin_inside(dst, n)) || (src_dev && !standin_inside(src, n)) || !dst || !src)
    return CUDA_ERROR_INVALID_VALUE;
  memmove((void *)dst, (const void *)src, n);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy("cuMemcpy", (uintptr_t)dst, 0, (uintptr_t)src, 0, n);
}
STANDIN_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
  return copy("cuMemcpyHtoD_v2", (uintptr_t)dst, 1, (uintptr_t)src, 0, n);
}
STANDIN_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
  return copy("cuMemcpyDtoH_v2", (uintptr_t)dst, 0, (uintptr_t)src, 1, n);
}
STANDIN_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return copy("cuMemcpyDtoD_v2", (uintptr_t)dst, 1, (uintptr_t)src, 1, n);
}
STANDIN_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return copy("cuMemcpyAsync", (uintptr_t)dst, 0, (uintptr_t)src, 0, n);
}
STANDIN_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
  (void)s;
  return copy("cuMemcpyHtoDAsync_v2", (uintptr_t)dst, 1, (uintptr_t)src, 0, n);
}
STANDIN_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return copy("cuMemcpyDtoHAsync_v2", (uintptr_t)dst, 0, (uintptr_t)src, 1, n);
}
STANDIN_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return copy("cuMemcpyDtoDAsync_v2", (uintptr_t)dst, 1, (uintptr_t)src, 1, n);
}
STANDIN_API CUresult cuMemcpyHtoD(CUdeviceptr d, const void *s, size_t n) { return cuMemcpyHtoD_v2(d, s, n); }
STANDIN_API CUresult cuMemcpyDtoH(void *d, CUdeviceptr s, size_t n) { return cuMemcpyDtoH_v2(d, s, n); }
STANDIN_API CUresult cuMemcpyDtoD(CUdeviceptr d, CUdeviceptr s, size_t n) { return cuMemcpyDtoD_v2(d, s, n); }

STANDIN_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  CU_TRACE("cuMemsetD8_v2(%p, %u, %zu)", (void *)(uintptr_t)dst, value, n);
  CHECK_INIT();
  if (n && !standin_inside((uintptr_t)dst, n)) return CUDA_ERROR_INVALID_VALUE;
  memset((void *)(uintptr_t)dst, value, n);
  return CUDA_SUCCESS;
}
STANDIN_API CUresult cuMemsetD8(CUdeviceptr d, unsigned char v, size_t n) { return cuMemsetD8_v2(d, v, n); }
STANDIN_API CUresult cuMemsetD8Async(CUdeviceptr d, unsigned char v, size_t n, CUstream s) {
  (void)s;
  return cuMemsetD8_v2(d, v, n);
}

STANDIN_API CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) {
  CU_TRACE("cuMemsetD32_v2(%p, %u, %zu)", (void *)(uintptr_t)dst, value, n);
  CHECK_INIT();
  if (dst % 4 || (n && (n > SIZE_MAX / 4 || !standin_inside((uintptr_t)dst, n * 4)))) return CUDA_ERROR_INVALID_VALUE;
  unsigned int *p = (unsigned int *)(uintptr_t)dst;
  for (size_t i = 0; i < n; i++) p[i] = value;
  return CUDA_SUCCESS;
}

/* No dma-buf exists here, whatever CCLKIT_CUDA_STANDIN_DMABUF says: refuse, as a
 * driver without dma-buf support does, so a plugin falls back to regMr. */
STANDIN_API CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr ptr, size_t size, int type,
                                                   unsigned long long flags) {
  CU_TRACE("cuMemGetHandleForAddressRange(%p, %zu, type=%d, flags=%llu) = CUDA_ERROR_NOT_SUPPORTED",
           (void *)(uintptr_t)ptr, size, type, flags);
  (void)handle;
  CHECK_INIT();
  return CUDA_ERROR_NOT_SUPPORTED;
}

/* Writes are visible at once in host memory; the flush is a full barrier. The only
 * target is the current context (0); the scopes are "to owner" (100) and "to all
 * devices" (200), as in cuda.h. */
STANDIN_API CUresult cuFlushGPUDirectRDMAWrites(int target, int scope) {
  CU_TRACE("cuFlushGPUDirectRDMAWrites(target=%d, scope=%d)", target, scope);
  CHECK_INIT();
  if (target != 0 || (scope != 100 && scope != 200)) return CUDA_ERROR_INVALID_VALUE;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  return CUDA_SUCCESS;
}
