/*
 * Baseline for benches/adapter.rs: the same isend/irecv/test cycle as the Rust bench,
 * calling the mock plugin's ncclNetPlugin_v12 table directly from C (no adapter).
 * usage: raw_baseline LIB.so ITERATIONS   -> prints "ns_per_cycle <float>"
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int res_t;
typedef struct {
  const char *name;
  res_t (*init)(void **, uint64_t, void *, void *, void *);
  res_t (*devices)(int *);
  res_t (*getProperties)(int, void *);
  res_t (*listen)(void *, int, void *, void **);
  res_t (*connect)(void *, int, void *, void **, void **);
  res_t (*accept)(void *, void **, void **);
  void *regMr, *regMrDmaBuf, *deregMr;
  res_t (*isend)(void *, void *, size_t, int, void *, void *, void **);
  res_t (*irecv)(void *, int, void **, size_t *, int *, void **, void **, void **);
  void *iflush;
  res_t (*test)(void *, int *, int *);
} net_t;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
  if (argc != 3) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
  net_t *n = dlsym(h, "ncclNetPlugin_v12");
  long iters = atol(argv[2]);
  void *ctx = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
  int cfg = -1;
  char handle[128] = {0};
  if (n->init(&ctx, 1, &cfg, NULL, NULL)) return 1;
  n->listen(ctx, 0, handle, &lc);
  while (!sc) n->connect(ctx, 0, handle, &sc, NULL);
  while (!rc) n->accept(lc, &rc, NULL);
  char src[8] = "payload", dst[16];
  double t0 = now();
  for (long i = 0; i < iters; i++) {
    void *rr = NULL, *sr = NULL, *data = dst, *mh = NULL, *ph = NULL;
    size_t size = sizeof dst;
    int tag = 5, done = 0, sizes[64] = {0}, ssize = 0;
    n->irecv(rc, 1, &data, &size, &tag, &mh, &ph, &rr);
    n->isend(sc, src, sizeof src, 5, NULL, NULL, &sr);
    while (!done) n->test(rr, &done, sizes);
    done = 0;
    while (!done) n->test(sr, &done, &ssize);
  }
  double dt = now() - t0;
  printf("ns_per_cycle %.1f\n", dt / iters);
  return 0;
}
