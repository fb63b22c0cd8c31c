/*
 * A net plugin for the device-path tests (core/tests/runtime_cuda.rs): forwards
 * every call to a real v12 plugin (NET_GDR_INNER, a path) but claims GPUDirect
 * RDMA, so a `--device cuda` communicator on the emulated GPU takes NCCL's direct
 * path without GPU hardware:
 *   - getProperties adds NCCL_PTR_CUDA (and NCCL_PTR_DMABUF with NET_GDR_DMABUF=1);
 *   - regMr with NCCL_PTR_CUDA, and regMrDmaBuf, register the memory with the
 *     inner plugin as host memory (the emulated GPU's memory is host memory);
 *   - iflush completes at its first test.
 * Every one of these is counted; net_gdr_stats() hands the counts to the test.
 * Built at test time against abi/include/cclkit_abi.h.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cclkit_abi.h"

static const ncclNet_v12_t *inner;
static ncclDebugLogger_t logger;
static atomic_long reg_host, reg_cuda, reg_dmabuf, flushes, flushed_bytes;
static char flush_token; /* the request iflush returns; done at its first test */

#define WARN(...) do { if (logger) logger(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); } while (0)

/* Counts so far: host regMr, CUDA regMr, regMrDmaBuf, iflush calls, bytes flushed. */
void net_gdr_stats(long out[5]) {
  out[0] = atomic_load(&reg_host);
  out[1] = atomic_load(&reg_cuda);
  out[2] = atomic_load(&reg_dmabuf);
  out[3] = atomic_load(&flushes);
  out[4] = atomic_load(&flushed_bytes);
}

static ncclResult_t f_init(void **ctx, uint64_t id, ncclNetCommConfig_v10_t *cfg, ncclDebugLogger_t log,
                           ncclProfilerCallback_t prof) {
  logger = log;
  const char *path = getenv("NET_GDR_INNER");
  void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  inner = lib ? dlsym(lib, "ncclNetPlugin_v12") : NULL;
  if (!inner) {
    WARN("net_gdr: cannot load the inner plugin NET_GDR_INNER=%s: %s", path ? path : "(unset)", dlerror());
    return ncclSystemError;
  }
  return inner->init(ctx, id, cfg, log, prof);
}

static ncclResult_t f_devices(int *n) { return inner->devices(n); }
static ncclResult_t f_props(int d, ncclNetProperties_v12_t *p) {
  ncclResult_t rc = inner->getProperties(d, p);
  if (rc == ncclSuccess) {
    const char *dmabuf = getenv("NET_GDR_DMABUF");
    p->ptrSupport |= NCCL_PTR_CUDA | (dmabuf && dmabuf[0] == '1' ? NCCL_PTR_DMABUF : 0);
  }
  return rc;
}
static ncclResult_t f_listen(void *ctx, int d, void *h, void **l) { return inner->listen(ctx, d, h, l); }
static ncclResult_t f_connect(void *ctx, int d, void *h, void **s, ncclNetDeviceHandle_v7_t **dh) {
  return inner->connect(ctx, d, h, s, dh);
}
static ncclResult_t f_accept(void *l, void **r, ncclNetDeviceHandle_v7_t **dh) { return inner->accept(l, r, dh); }
static ncclResult_t f_regMr(void *c, void *d, size_t n, int t, void **mh) {
  if (t == NCCL_PTR_CUDA) {
    atomic_fetch_add(&reg_cuda, 1);
    t = NCCL_PTR_HOST;
  } else {
    atomic_fetch_add(&reg_host, 1);
  }
  return inner->regMr(c, d, n, t, mh);
}
static ncclResult_t f_regMrDmaBuf(void *c, void *d, size_t n, int t, uint64_t o, int fd, void **mh) {
  (void)t, (void)o;
  if (fd < 0) {
    WARN("net_gdr: regMrDmaBuf with fd %d", fd);
    return ncclInvalidArgument;
  }
  atomic_fetch_add(&reg_dmabuf, 1);
  return inner->regMr(c, d, n, NCCL_PTR_HOST, mh);
}
static ncclResult_t f_deregMr(void *c, void *mh) { return inner->deregMr(c, mh); }
static ncclResult_t f_isend(void *c, void *d, size_t n, int tag, void *mh, void *ph, void **req) {
  return inner->isend(c, d, n, tag, mh, ph, req);
}
static ncclResult_t f_irecv(void *c, int n, void **d, size_t *s, int *t, void **mh, void **ph, void **req) {
  return inner->irecv(c, n, d, s, t, mh, ph, req);
}
static ncclResult_t f_iflush(void *c, int n, void **d, int *s, void **mh, void **req) {
  (void)c, (void)d, (void)mh;
  atomic_fetch_add(&flushes, 1);
  for (int i = 0; i < n; i++) atomic_fetch_add(&flushed_bytes, s[i]);
  *req = &flush_token;
  return ncclSuccess;
}
static ncclResult_t f_test(void *r, int *done, int *sizes) {
  if (r == &flush_token) {
    *done = 1;
    return ncclSuccess;
  }
  return inner->test(r, done, sizes);
}
static ncclResult_t f_closeSend(void *c) { return inner->closeSend(c); }
static ncclResult_t f_closeRecv(void *c) { return inner->closeRecv(c); }
static ncclResult_t f_closeListen(void *c) { return inner->closeListen(c); }
static ncclResult_t f_getDeviceMr(void *c, void *mh, void **dp) {
  return inner->getDeviceMr ? inner->getDeviceMr(c, mh, dp) : ncclInternalError;
}
static ncclResult_t f_irecvConsumed(void *c, int n, void *r) {
  return inner->irecvConsumed ? inner->irecvConsumed(c, n, r) : ncclSuccess;
}
static ncclResult_t f_makeVDevice(int *d, ncclNetVDeviceProps_v12_t *p) {
  return inner->makeVDevice ? inner->makeVDevice(d, p) : ncclInternalError;
}
static ncclResult_t f_finalize(void *ctx) { return inner->finalize(ctx); }
static ncclResult_t f_setNetAttr(void *ctx, ncclNetAttr_v11_t *a) {
  return inner->setNetAttr ? inner->setNetAttr(ctx, a) : ncclSuccess;
}

const ncclNet_v12_t ncclNetPlugin_v12 = {
    "GdrSocket", f_init, f_devices, f_props, f_listen, f_connect, f_accept, f_regMr, f_regMrDmaBuf,
    f_deregMr, f_isend, f_irecv, f_iflush, f_test, f_closeSend, f_closeRecv, f_closeListen,
    f_getDeviceMr, f_irecvConsumed, f_makeVDevice, f_finalize, f_setNetAttr,
};
