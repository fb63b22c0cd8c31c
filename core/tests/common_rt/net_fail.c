/*
 * A net plugin for the fault tests: forwards every call to a real v12 plugin
 * (NET_FAIL_INNER, a path) and makes isend fail once NET_FAIL_AFTER isends have
 * been posted, logging a WARN first, as a real plugin reports a broken link.
 * Without NET_FAIL_AFTER it never fails, so every rank can load the same plugin
 * while one of them breaks. Built at test time against abi/include/cclkit_abi.h.
 */
#include <dlfcn.h>
#include <stdlib.h>

#include "cclkit_abi.h"

static const ncclNet_v12_t *inner;
static ncclDebugLogger_t logger;
static long posted;
static long fail_after = -1;

#define WARN(...) do { if (logger) logger(NCCL_LOG_WARN, NCCL_NET, __FILE__, __LINE__, __VA_ARGS__); } while (0)

static ncclResult_t f_init(void **ctx, uint64_t id, ncclNetCommConfig_v10_t *cfg, ncclDebugLogger_t log,
                           ncclProfilerCallback_t prof) {
  logger = log;
  const char *path = getenv("NET_FAIL_INNER");
  void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
  inner = lib ? dlsym(lib, "ncclNetPlugin_v12") : NULL;
  if (!inner) {
    WARN("net_fail: cannot load the inner plugin NET_FAIL_INNER=%s: %s", path ? path : "(unset)", dlerror());
    return ncclSystemError;
  }
  const char *after = getenv("NET_FAIL_AFTER");
  fail_after = after ? atol(after) : -1;
  return inner->init(ctx, id, cfg, log, prof);
}

static ncclResult_t f_devices(int *n) { return inner->devices(n); }
static ncclResult_t f_props(int d, ncclNetProperties_v12_t *p) { return inner->getProperties(d, p); }
static ncclResult_t f_listen(void *ctx, int d, void *h, void **l) { return inner->listen(ctx, d, h, l); }
static ncclResult_t f_connect(void *ctx, int d, void *h, void **s, ncclNetDeviceHandle_v7_t **dh) {
  return inner->connect(ctx, d, h, s, dh);
}
static ncclResult_t f_accept(void *l, void **r, ncclNetDeviceHandle_v7_t **dh) { return inner->accept(l, r, dh); }
static ncclResult_t f_regMr(void *c, void *d, size_t n, int t, void **mh) { return inner->regMr(c, d, n, t, mh); }
static ncclResult_t f_regMrDmaBuf(void *c, void *d, size_t n, int t, uint64_t o, int fd, void **mh) {
  return inner->regMrDmaBuf ? inner->regMrDmaBuf(c, d, n, t, o, fd, mh) : ncclInternalError;
}
static ncclResult_t f_deregMr(void *c, void *mh) { return inner->deregMr(c, mh); }

static ncclResult_t f_isend(void *c, void *d, size_t n, int tag, void *mh, void *ph, void **req) {
  if (fail_after >= 0 && posted >= fail_after) {
    WARN("net_fail: isend of %zu bytes refused on purpose after %ld sends", n, posted);
    return ncclSystemError;
  }
  ncclResult_t rc = inner->isend(c, d, n, tag, mh, ph, req);
  if (rc == ncclSuccess && *req) posted++;
  return rc;
}

static ncclResult_t f_irecv(void *c, int n, void **d, size_t *s, int *t, void **mh, void **ph, void **req) {
  return inner->irecv(c, n, d, s, t, mh, ph, req);
}
static ncclResult_t f_iflush(void *c, int n, void **d, int *s, void **mh, void **req) {
  return inner->iflush(c, n, d, s, mh, req);
}
static ncclResult_t f_test(void *r, int *done, int *sizes) { return inner->test(r, done, sizes); }
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
    "FailingSocket", f_init, f_devices, f_props, f_listen, f_connect, f_accept, f_regMr, f_regMrDmaBuf,
    f_deregMr, f_isend, f_irecv, f_iflush, f_test, f_closeSend, f_closeRecv, f_closeListen,
    f_getDeviceMr, f_irecvConsumed, f_makeVDevice, f_finalize, f_setNetAttr,
};
