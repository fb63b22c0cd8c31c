/*
 * Driver API: initialisation, versions, devices and their attributes, contexts,
 * error names. Memory is in memory.c, streams and events in streams.c, entry-point
 * lookup in procaddr.c, the unimplemented rest in unimpl.c.
 *
 *   CCLKIT_CUDA_STANDIN_DEVICES=N   devices (1..16, default 1)
 *   CCLKIT_CUDA_STANDIN_GDR=1       report GPUDirect RDMA support (default 0)
 *   CCLKIT_CUDA_STANDIN_DMABUF=1    report dma-buf support (default 0; cuMemGetHandle-
 *                                   ForAddressRange still refuses: there is no dma-buf)
 *
 * Each device looks like an H100 SXM (compute capability 9.0, 132 SMs, 80 GiB) at
 * PCI address 0000:<0x18 + 0x10*ordinal>:00.0, the form nvidia-smi and NCCL's
 * topology code read. Every thread starts with device 0's primary context current,
 * as in NCCL, which makes a device current in every thread that calls a plugin.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "standin.h"

#define MAX_DEVICES 16
#define DRIVER_VERSION 12040 /* CUDA 12.4 */

struct standin_ctx {
  int device;
  int primary;
};

static struct standin_ctx primary[MAX_DEVICES];
static int initialized;
static int ndev = 1;
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* The thread's current context; NULL means "device 0's primary" until set. */
static __thread CUcontext current;
static __thread int current_set;

static void setup(void) {
  ndev = standin_env_int("CCLKIT_CUDA_STANDIN_DEVICES", 1, 1, MAX_DEVICES);
  for (int i = 0; i < MAX_DEVICES; i++) primary[i] = (struct standin_ctx){.device = i, .primary = 1};
}

int standin_initialized(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }
int standin_device_count(void) { return ndev; }
CUcontext standin_primary_ctx(int dev) { return &primary[dev]; }

static CUcontext current_ctx(void) { return current_set ? current : &primary[0]; }

int standin_current_device(void) {
  CUcontext c = current_ctx();
  return c ? c->device : 0;
}

static int valid_device(CUdevice d) { return d >= 0 && d < ndev; }

STANDIN_API CUresult cuInit(unsigned int flags) {
  CU_TRACE("cuInit(flags=%u)", flags);
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  pthread_once(&once, setup);
  __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDriverGetVersion(int *version) {
  CU_TRACE("cuDriverGetVersion() = %d", DRIVER_VERSION);
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = DRIVER_VERSION; /* answered before cuInit, like the real driver */
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetCount(int *count) {
  CU_TRACE("cuDeviceGetCount() = %d", ndev);
  CHECK_INIT();
  if (!count) return CUDA_ERROR_INVALID_VALUE;
  *count = ndev;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  CU_TRACE("cuDeviceGet(ordinal=%d)", ordinal);
  CHECK_INIT();
  if (!device) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  CU_TRACE("cuDeviceGetName(dev=%d)", dev);
  CHECK_INIT();
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(name, (size_t)len, "cclkit CUDA stand-in (host memory)");
  return CUDA_SUCCESS;
}

/* PCI bus number of a device: distinct per device, as on an 8-GPU board. */
static int pci_bus(int dev) { return 0x18 + 0x10 * dev; }

STANDIN_API CUresult cuDeviceGetPCIBusId(char *bus, int len, CUdevice dev) {
  CU_TRACE("cuDeviceGetPCIBusId(dev=%d)", dev);
  CHECK_INIT();
  if (!bus || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  snprintf(bus, (size_t)len, "0000:%02x:00.0", pci_bus(dev));
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *bus) {
  CU_TRACE("cuDeviceGetByPCIBusId(%s)", bus ? bus : "(null)");
  CHECK_INIT();
  if (!dev || !bus) return CUDA_ERROR_INVALID_VALUE;
  unsigned domain = 0, b = 0, d = 0, f = 0;
  if (sscanf(bus, "%x:%x:%x.%x", &domain, &b, &d, &f) != 4) return CUDA_ERROR_INVALID_VALUE;
  for (int i = 0; i < ndev; i++) {
    if (domain == 0 && b == (unsigned)pci_bus(i) && d == 0 && f == 0) {
      *dev = i;
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_DEVICE;
}

typedef struct { unsigned char bytes[16]; } CUuuid;

static CUresult device_uuid(CUuuid *uuid, CUdevice dev) {
  CHECK_INIT();
  if (!uuid) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  static const unsigned char stem[16] = "cclkit-standin";
  memcpy(uuid->bytes, stem, sizeof stem);
  uuid->bytes[15] = (unsigned char)dev;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
  CU_TRACE("cuDeviceGetUuid(dev=%d)", dev);
  return device_uuid(uuid, dev);
}

STANDIN_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
  CU_TRACE("cuDeviceGetUuid_v2(dev=%d)", dev);
  return device_uuid(uuid, dev);
}

#define TOTAL_MEM (80ull << 30)

STANDIN_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
  CU_TRACE("cuDeviceTotalMem_v2(dev=%d)", dev);
  CHECK_INIT();
  if (!bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)TOTAL_MEM;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) { return cuDeviceTotalMem_v2(bytes, dev); }

/* The modelled attributes (CUdevice_attribute numbers from cuda.h); -1: not modelled. */
static int attribute(int attr, int dev) {
  switch (attr) {
    case 1: return 1024;              /* MAX_THREADS_PER_BLOCK */
    case 2: return 1024;              /* MAX_BLOCK_DIM_X */
    case 3: return 1024;              /* MAX_BLOCK_DIM_Y */
    case 4: return 64;                /* MAX_BLOCK_DIM_Z */
    case 5: return 2147483647;        /* MAX_GRID_DIM_X */
    case 6: return 65535;             /* MAX_GRID_DIM_Y */
    case 7: return 65535;             /* MAX_GRID_DIM_Z */
    case 8: return 49152;             /* MAX_SHARED_MEMORY_PER_BLOCK */
    case 9: return 65536;             /* TOTAL_CONSTANT_MEMORY */
    case 10: return 32;               /* WARP_SIZE */
    case 11: return 2147483647;       /* MAX_PITCH */
    case 12: return 65536;            /* MAX_REGISTERS_PER_BLOCK */
    case 13: return 1980000;          /* CLOCK_RATE (kHz) */
    case 14: return 512;              /* TEXTURE_ALIGNMENT */
    case 15: return 1;                /* GPU_OVERLAP */
    case 16: return 132;              /* MULTIPROCESSOR_COUNT */
    case 17: return 0;                /* KERNEL_EXEC_TIMEOUT */
    case 18: return 0;                /* INTEGRATED */
    case 19: return 1;                /* CAN_MAP_HOST_MEMORY */
    case 20: return 0;                /* COMPUTE_MODE: default */
    case 31: return 1;                /* CONCURRENT_KERNELS */
    case 32: return 1;                /* ECC_ENABLED */
    case 33: return pci_bus(dev);     /* PCI_BUS_ID */
    case 34: return 0;                /* PCI_DEVICE_ID (the slot) */
    case 35: return 0;                /* TCC_DRIVER */
    case 36: return 2619000;          /* MEMORY_CLOCK_RATE (kHz) */
    case 37: return 5120;             /* GLOBAL_MEMORY_BUS_WIDTH */
    case 38: return 52428800;         /* L2_CACHE_SIZE */
    case 39: return 2048;             /* MAX_THREADS_PER_MULTIPROCESSOR */
    case 40: return 3;                /* ASYNC_ENGINE_COUNT */
    case 41: return 1;                /* UNIFIED_ADDRESSING */
    case 50: return 0;                /* PCI_DOMAIN_ID */
    case 75: return 9;                /* COMPUTE_CAPABILITY_MAJOR */
    case 76: return 0;                /* COMPUTE_CAPABILITY_MINOR */
    case 81: return 233472;           /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */
    case 82: return 65536;            /* MAX_REGISTERS_PER_MULTIPROCESSOR */
    case 83: return 1;                /* MANAGED_MEMORY */
    case 84: return 0;                /* MULTI_GPU_BOARD */
    case 85: return dev;              /* MULTI_GPU_BOARD_GROUP_ID */
    case 89: return 1;                /* CONCURRENT_MANAGED_ACCESS */
    case 91: return 1;                /* CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM */
    case 95: return 1;                /* COOPERATIVE_LAUNCH */
    case 97: return 232448;           /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */
    case 102: return 0;               /* VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: no cuMemCreate */
    case 103: return 0;               /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
    case 106: return 32;              /* MAX_BLOCKS_PER_MULTIPROCESSOR */
    case 110: return 0;               /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED */
    case 115: return 0;               /* MEMORY_POOLS_SUPPORTED */
    case 116: return standin_env_int("CCLKIT_CUDA_STANDIN_GDR", 0, 0, 1);    /* GPU_DIRECT_RDMA_SUPPORTED */
    case 117: return 0;               /* GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS */
    case 118: return 0;               /* GPU_DIRECT_RDMA_WRITES_ORDERING: none */
    case 124: return standin_env_int("CCLKIT_CUDA_STANDIN_DMABUF", 0, 0, 1); /* DMA_BUF_SUPPORTED */
    case 132: return 0;               /* MULTICAST_SUPPORTED */
    default: return -1;
  }
}

STANDIN_API CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice dev) {
  CHECK_INIT();
  if (!value) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int v = attribute(attr, dev);
  CU_TRACE("cuDeviceGetAttribute(attr=%d, dev=%d) = %d", attr, dev, v);
  if (v < 0) {
    /* Named by number, so each unmodelled attribute is reported once. */
    standin_missing("libcuda", standin_numbered("cuDeviceGetAttribute", attr), CUDA_ERROR_INVALID_VALUE,
                    "CUDA_ERROR_INVALID_VALUE");
    return CUDA_ERROR_INVALID_VALUE;
  }
  *value = v;
  return CUDA_SUCCESS;
}

/* ---- contexts: one primary context per device, no others ----------------------- */

STANDIN_API CUresult cuCtxGetCurrent(CUcontext *ctx) {
  CHECK_INIT();
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  *ctx = current_ctx();
  CU_TRACE("cuCtxGetCurrent() = device %d", *ctx ? (*ctx)->device : -1);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  CU_TRACE("cuCtxSetCurrent(device %d)", ctx ? ctx->device : -1);
  CHECK_INIT();
  if (ctx && (ctx < &primary[0] || ctx >= &primary[ndev])) return CUDA_ERROR_INVALID_CONTEXT;
  current = ctx;
  current_set = 1;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxGetDevice(CUdevice *dev) {
  CHECK_INIT();
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  CUcontext c = current_ctx();
  CU_TRACE("cuCtxGetDevice() = %d", c ? c->device : -1);
  if (!c) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = c->device;
  return CUDA_SUCCESS;
}

/* One level of push/pop is what plugins use (set a device around a call). */
static __thread CUcontext pushed[8];
static __thread int npushed;

STANDIN_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  CU_TRACE("cuCtxPushCurrent_v2(device %d)", ctx ? ctx->device : -1);
  CHECK_INIT();
  if (!ctx || ctx < &primary[0] || ctx >= &primary[ndev]) return CUDA_ERROR_INVALID_CONTEXT;
  if (npushed == 8) return CUDA_ERROR_INVALID_VALUE;
  pushed[npushed++] = current_ctx();
  current = ctx;
  current_set = 1;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
  CU_TRACE("cuCtxPopCurrent_v2()");
  CHECK_INIT();
  if (npushed == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx) *ctx = current_ctx();
  current = pushed[--npushed];
  current_set = 1;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }
STANDIN_API CUresult cuCtxPopCurrent(CUcontext *ctx) { return cuCtxPopCurrent_v2(ctx); }

STANDIN_API CUresult cuCtxSynchronize(void) {
  CU_TRACE("cuCtxSynchronize()");
  CHECK_INIT();
  return CUDA_SUCCESS; /* every operation already completed synchronously */
}

STANDIN_API CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  CU_TRACE("cuDevicePrimaryCtxRetain(dev=%d)", dev);
  CHECK_INIT();
  if (!ctx) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = &primary[dev];
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  CU_TRACE("cuDevicePrimaryCtxRelease_v2(dev=%d)", dev);
  CHECK_INIT();
  return valid_device(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

STANDIN_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

STANDIN_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
  CU_TRACE("cuDevicePrimaryCtxGetState(dev=%d)", dev);
  CHECK_INIT();
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = 1;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer) {
  CU_TRACE("cuDeviceCanAccessPeer(%d, %d)", dev, peer);
  CHECK_INIT();
  if (!can) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev) || !valid_device(peer)) return CUDA_ERROR_INVALID_DEVICE;
  *can = 0; /* no NVLink or PCI peer access is modelled */
  return CUDA_SUCCESS;
}

/* ---- errors ---------------------------------------------------------------------- */

static const struct { int code; const char *name, *text; } errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_MISALIGNED_ADDRESS, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

STANDIN_API CUresult cuGetErrorName(CUresult error, const char **str) {
  CU_TRACE("cuGetErrorName(%d)", error);
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
    if (errors[i].code == error) {
      *str = errors[i].name;
      return CUDA_SUCCESS;
    }
  }
  *str = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}

STANDIN_API CUresult cuGetErrorString(CUresult error, const char **str) {
  CU_TRACE("cuGetErrorString(%d)", error);
  if (!str) return CUDA_ERROR_INVALID_VALUE;
  if (error == CUDA_ERROR_NOT_SUPPORTED && standin_last_missing()) {
    /* The text a plugin logs then names the call the stand-in lacks. */
    static char text[160];
    snprintf(text, sizeof text, "operation not supported (cclkit CUDA stand-in: %s is not implemented)",
             standin_last_missing());
    *str = text;
    return CUDA_SUCCESS;
  }
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
    if (errors[i].code == error) {
      *str = errors[i].text;
      return CUDA_SUCCESS;
    }
  }
  *str = NULL;
  return CUDA_ERROR_INVALID_VALUE;
}
