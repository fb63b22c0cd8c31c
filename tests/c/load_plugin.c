/* A C host built against the committed header: dlopens a packaged net plugin and a
 * tuner, calls them through the v12 / v6 tables as NCCL 2.30 does, and checks results.
 * usage: load_plugin NET.so TUNER.so */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "cclkit_abi.h"

static int failures;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  va_list ap; va_start(ap, fmt);
  fprintf(stderr, "[plugin log level %d flags %lx %s:%d] ", (int)level, flags, file, line);
  vfprintf(stderr, fmt, ap); fputc('\n', stderr);
  va_end(ap);
}

static int net(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); return 1; }
  const ncclNet_v12_t* n = (const ncclNet_v12_t*)dlsym(lib, "ncclNetPlugin_v12");
  CHECK(n != NULL);
  if (!n) return 1;
  CHECK(n->name != NULL && strlen(n->name) > 0);
  void* ctx = NULL;
  ncclNetCommConfig_v10_t cfg = { NCCL_NET_TRAFFIC_CLASS_UNDEF };
  CHECK(n->init(&ctx, 42, &cfg, logger, NULL) == ncclSuccess && ctx != NULL);
  int ndev = 0;
  CHECK(n->devices(&ndev) == ncclSuccess && ndev > 0);
  /* v12 properties into a buffer with canaries on both sides. */
  unsigned char buf[16 + sizeof(ncclNetProperties_v12_t) + 16];
  memset(buf, 0xA5, sizeof buf);
  ncclNetProperties_v12_t* p = (ncclNetProperties_v12_t*)(buf + 16);
  CHECK(n->getProperties(0, p) == ncclSuccess);
  for (int i = 0; i < 16; i++) { CHECK(buf[i] == 0xA5); CHECK(buf[sizeof buf - 1 - i] == 0xA5); }
  CHECK(p->name != NULL);
  CHECK(p->ptrSupport & NCCL_PTR_HOST);
  CHECK(p->maxRecvs >= 1);
  CHECK(p->netDeviceType == NCCL_NET_DEVICE_HOST);
  CHECK(p->vProps.ndevs == 1 && p->vProps.devs[0] == 0);
  CHECK(p->maxP2pBytes > 0 && p->maxCollBytes > 0);
  /* Bad input yields an error code, never a crash. */
  CHECK(n->getProperties(ndev, p) == ncclInvalidArgument);
  CHECK(n->closeSend((void*)buf) == ncclInvalidArgument);
  CHECK(n->finalize(ctx) == ncclSuccess);
  printf("net   %s: name=%s devices=%d dev0=%s speed=%d Mbps\n", path, n->name, ndev, p->name, p->speed);
  dlclose(lib);
  return 0;
}

static int tuner(const char* path) {
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen %s: %s\n", path, dlerror()); return 1; }
  const ncclTuner_v6_t* t = (const ncclTuner_v6_t*)dlsym(lib, "ncclTunerPlugin_v6");
  CHECK(t != NULL);
  if (!t) return 1;
  void* ctx = NULL;
  ncclNvlDomainInfo_v5_t nvl = { 1, 4, 4 };
  ncclTunerConstants_v5_t constants;
  memset(&constants, 0, sizeof constants);
  CHECK(t->init(&ctx, 7, 4, 1, logger, &nvl, &constants) == ncclSuccess && ctx != NULL);
  float table[1 + NCCL_NUM_ALGORITHMS * NCCL_NUM_PROTOCOLS + 1];
  for (int i = 0; i < (int)(sizeof table / sizeof table[0]); i++) table[i] = NCCL_ALGO_PROTO_IGNORE;
  table[0] = 12345.0f; table[sizeof table / sizeof table[0] - 1] = 54321.0f;
  float* flat = table + 1;
  for (int a = NCCL_ALGO_TREE; a <= NCCL_ALGO_RING; a++)
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) flat[a * NCCL_NUM_PROTOCOLS + p] = 100.0f;
  int nch = 0;
  CHECK(t->getCollInfo(ctx, ncclFuncAllReduce, 1 << 20, 1, (float**)flat, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &nch) == ncclSuccess);
  CHECK(table[0] == 12345.0f && table[sizeof table / sizeof table[0] - 1] == 54321.0f);
  int lowered = 0, enabled = 0;
  for (int i = 0; i < NCCL_NUM_ALGORITHMS * NCCL_NUM_PROTOCOLS; i++) {
    int a = i / NCCL_NUM_PROTOCOLS;
    if (flat[i] >= 0.0f && flat[i] < 100.0f) lowered++;
    if (a > NCCL_ALGO_RING && flat[i] != NCCL_ALGO_PROTO_IGNORE) enabled++;
  }
  CHECK(lowered >= 1);
  CHECK(enabled == 0);
  CHECK(t->finalize(ctx) == ncclSuccess);
  printf("tuner %s: name=%s lowered=%d entries\n", path, t->name, lowered);
  dlclose(lib);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s NET.so TUNER.so\n", argv[0]); return 2; }
  int rc = net(argv[1]) | tuner(argv[2]);
  if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
  return rc || failures ? 1 : 0;
}
