/* A C host for every tuner-constants layout a cclkit tuner can meet: NCCL v5/v6 (1152
 * bytes), NCCL v7 (1272), RCCL with bwRatio and 7 algorithms (1488) or 8 (1632). For
 * each, it fills the struct between canaries, puts a distinctive latency or bandwidth
 * into one field at that layout's offset, and checks that the tuner's decision moves
 * (so the tuner read that field, at that offset) while the canaries stay intact.
 * For the 8-algorithm RCCL layout it also puts the value where a reader of NCCL's
 * layout would look, and checks that the decision does not move.
 * usage: tuner_layouts TUNER.so [canaries]
 *   a cclkit model tuner: decisions follow the constants; with `canaries` (a tuner
 *   whose decisions ignore the constants, such as the template) only the canaries
 *   around the struct and the cost table, and the unsupported rows, are checked. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cclkit_abi.h"

static int failures;
#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); failures++; } } while (0)

#define PAD 8           /* canary doubles on each side */
#define MAXD 204        /* the largest layout: 1632 bytes */
#define CANARY -4242.0625

typedef struct {
  const char *label;
  const char *symbol; /* table the host calls */
  const char *flavor; /* CCLKIT_FLAVOR */
  const char *algos;  /* CCLKIT_RCCL_NUM_ALGO, NULL = unset */
  int bytes, na, ncc;
} layout_t;

static const layout_t LAYOUTS[] = {
  {"NCCL v5 1152", "ncclTunerPlugin_v5", "nccl", NULL, 1152, 7, 4},
  {"NCCL v6 1152", "ncclTunerPlugin_v6", "nccl", NULL, 1152, 7, 4},
  {"NCCL v7 1272", "ncclTunerPlugin_v7", "nccl", NULL, 1272, 7, 5},
  {"RCCL v6 1488", "ncclTunerPlugin_v6", "rccl", "7", 1488, 7, 4},
  {"RCCL v5 1632", "ncclTunerPlugin_v5", "rccl", "8", 1632, 8, 4},
  {"RCCL v6 1632", "ncclTunerPlugin_v6", "rccl", NULL, 1632, 8, 4},
};

/* Double index of hwLatencies[h][a][p], of bandwidth table t (0 = llMaxBws) row cc
 * column s, and of bwRatio[r][a][p], in a layout with na algorithms and ncc rows. */
static int hw_at(int na, int h, int a, int p) { return na * 3 + (h * na + a) * 3 + p; }
static int bw_at(int na, int ncc, int t, int cc, int s) { return na * 12 + t * ncc * 3 + cc * 3 + s; }
static int ratio_at(int na, int ncc, int r, int a, int p) { return na * 12 + 5 * ncc * 3 + (r * na + a) * 3 + p; }

/* WARNs the tuner logged (e.g. a cost table contradicting the layout it assumed). */
static int warns;
static char last_warn[512];
static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line, const char *fmt, ...) {
  (void)flags; (void)file; (void)line;
  if (level != NCCL_LOG_WARN) return;
  warns++;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_warn, sizeof last_warn, fmt, ap);
  va_end(ap);
}

typedef ncclResult_t (*init_fn)(void **, uint64_t, uintptr_t, uintptr_t, ncclDebugLogger_t, ncclNvlDomainInfo_v5_t *, void *);
typedef ncclResult_t (*coll_fn)(void *, ncclFunc_t, uintptr_t, int, float **, int, int, int, int *);
typedef ncclResult_t (*fin_fn)(void *);

typedef struct { init_fn init; coll_fn coll; fin_fn fin; } tuner_t;

/* v5, v6 and v7 share the first four slots: name, init, getCollInfo, finalize. */
static tuner_t table_of(void *lib, const char *symbol) {
  tuner_t t = {0};
  void *const *slots = (void *const *)dlsym(lib, symbol);
  if (!slots) return t;
  memcpy(&t.init, &slots[1], sizeof(void *));
  memcpy(&t.coll, &slots[2], sizeof(void *));
  memcpy(&t.fin, &slots[3], sizeof(void *));
  return t;
}

static void fill(const layout_t *l, double *c) {
  int n = l->bytes / 8;
  for (int i = 0; i < n; i++) c[i] = 0.0;
  for (int i = 0; i < l->na * 3; i++) c[i] = 6.0;                  /* base latencies */
  for (int h = 0; h < 3; h++)
    for (int a = 0; a < l->na; a++)
      for (int p = 0; p < 3; p++) c[hw_at(l->na, h, a, p)] = 1.5 + p; /* hw latencies */
  for (int t = 0; t < 5; t++)
    for (int cc = 0; cc < l->ncc; cc++)
      for (int s = 0; s < 3; s++) c[bw_at(l->na, l->ncc, t, cc, s)] = 60.0;
  if (l->bytes > (l->na * 12 + 5 * l->ncc * 3) * 8)
    for (int r = 0; r < 2; r++)
      for (int a = 0; a < l->na; a++)
        for (int p = 0; p < 3; p++) c[ratio_at(l->na, l->ncc, r, a, p)] = 1.0;
}

/* One communicator (16 ranks on 2 nodes) with `c`; returns the entry the tuner made
 * cheapest for an allreduce of `bytes`, as a*3+p, or -1. The cost table has
 * `table_na` rows (the layout's own count unless a test contradicts it). */
static int decide_na(const layout_t *l, tuner_t t, double *buf, size_t bytes, int table_na);
static int decide(const layout_t *l, tuner_t t, double *buf, size_t bytes) {
  return decide_na(l, t, buf, bytes, l->na);
}
static int decide_na(const layout_t *l, tuner_t t, double *buf, size_t bytes, int table_na) {
  double *c = buf + PAD;
  for (int i = 0; i < PAD; i++) { buf[i] = CANARY; c[l->bytes / 8 + i] = CANARY; }
  ncclNvlDomainInfo_v5_t nvl = {2, 8, 8};
  void *ctx = NULL;
  CHECK(t.init(&ctx, 0xc0ffee, 16, 2, logger, &nvl, c) == ncclSuccess && ctx != NULL);
  for (int i = 0; i < PAD; i++) { CHECK(buf[i] == CANARY); CHECK(c[l->bytes / 8 + i] == CANARY); }
  if (!ctx) return -1;
  /* Tree and Ring in every protocol offered at the same cost; the rest unsupported.
   * Canaries around the cost table too; RCCL's 8th row (DIRECT_A2A) stays -1. */
  float tb[PAD + 24 + PAD];
  for (int i = 0; i < PAD + 24 + PAD; i++) tb[i] = -3.5f;
  float *cost = tb + PAD;
  for (int i = 0; i < table_na * 3; i++) cost[i] = i < 6 ? 1000.0f : -1.0f;
  int nch = 0;
  for (int call = 0; call < 2; call++)
    CHECK(t.coll(ctx, ncclFuncAllReduce, bytes, 1, (float **)cost, table_na, 3, 0, &nch) == ncclSuccess);
  for (int i = 0; i < PAD; i++) { CHECK(tb[i] == -3.5f); CHECK(cost[table_na * 3 + i] == -3.5f); }
  for (int i = 6; i < table_na * 3; i++) CHECK(cost[i] == -1.0f);
  int best = -1;
  for (int i = 0; i < 6; i++)
    if (cost[i] >= 0.0f && (best < 0 || cost[i] < cost[best])) best = i;
  CHECK(t.fin(ctx) == ncclSuccess);
  return best;
}

static const char *name_of(int e) {
  static const char *n[] = {"TREE/LL", "TREE/LL128", "TREE/SIMPLE", "RING/LL", "RING/LL128", "RING/SIMPLE"};
  return e >= 0 && e < 6 ? n[e] : "none";
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "canaries") != 0)) {
    fprintf(stderr, "usage: %s TUNER.so [canaries]\n", argv[0]);
    return 2;
  }
  int decisions = argc == 2;
  void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror()); return 1; }
  unsetenv("CCLKIT_TUNER_CONFIG");
  /* The offset formulas against the layouts asserted in abi/src/raw/tuner (bytes). */
  CHECK(hw_at(7, 0, 0, 0) * 8 == 168 && bw_at(7, 4, 0, 0, 0) * 8 == 672);
  CHECK(bw_at(7, 4, 4, 0, 0) * 8 == 1056 && ratio_at(7, 4, 0, 0, 0) * 8 == 1152);
  CHECK(bw_at(7, 5, 1, 0, 0) * 8 == 792 && bw_at(7, 5, 4, 0, 0) * 8 == 1152);
  CHECK(hw_at(8, 0, 0, 0) * 8 == 192 && bw_at(8, 4, 0, 0, 0) * 8 == 768);
  CHECK(bw_at(8, 4, 4, 0, 0) * 8 == 1152 && ratio_at(8, 4, 0, 0, 0) * 8 == 1248);
  CHECK(ratio_at(8, 4, 1, 7, 2) * 8 + 8 == 1632 && ratio_at(7, 4, 1, 6, 2) * 8 + 8 == 1488);
  for (size_t k = 0; k < sizeof LAYOUTS / sizeof LAYOUTS[0]; k++) {
    const layout_t *l = &LAYOUTS[k];
    setenv("CCLKIT_FLAVOR", l->flavor, 1);
    if (l->algos) setenv("CCLKIT_RCCL_NUM_ALGO", l->algos, 1); else unsetenv("CCLKIT_RCCL_NUM_ALGO");
    tuner_t t = table_of(lib, l->symbol);
    CHECK(t.init && t.coll && t.fin);
    if (!t.init) continue;
    double buf[PAD + MAXD + PAD];
    double *c = buf + PAD;
    const size_t small = 4096, mid = 1 << 16;

    /* Latency: make the small-message choice's NET latency huge. */
    fill(l, c);
    int d0 = decide(l, t, buf, small);
    fill(l, c);
    c[hw_at(l->na, 2, d0 / 3, d0 % 3)] = 1.0e6;
    int d1 = decide(l, t, buf, small);
    if (decisions) CHECK(d0 >= 0 && d1 >= 0 && d1 != d0);

    /* Bandwidth: starve LL (llMaxBws, two-node column, every GPU generation row). */
    fill(l, c);
    int b0 = decide(l, t, buf, mid);
    fill(l, c);
    for (int cc = 0; cc < l->ncc; cc++) c[bw_at(l->na, l->ncc, 0, cc, 1)] = 0.001;
    int b1 = decide(l, t, buf, mid);
    if (decisions) {
      CHECK(b1 >= 0 && b1 % 3 != 0);
      CHECK(b0 % 3 != 0 || b1 != b0);
    }

    /* The same huge latency where a reader of NCCL's 7-algorithm layout would look
     * (in an 8-algorithm struct that is a PCI latency of an algorithm not offered). */
    int moved_wrong = 0;
    if (decisions && l->na == 8) {
      fill(l, c);
      c[hw_at(7, 2, d0 / 3, d0 % 3)] = 1.0e6;
      int w = decide(l, t, buf, small);
      moved_wrong = w != d0;
      CHECK(w == d0);
    }
    if (decisions) CHECK(warns == 0);
    printf("tuner %-13s small %s -> %s with NET latency raised; 64 KiB %s -> %s with LL capped%s\n",
           l->label, name_of(d0), name_of(d1), name_of(b0), name_of(b1),
           !decisions ? " (decisions not checked: canaries only)"
           : l->na == 8 ? (moved_wrong ? "; MOVED by NCCL-offset value" : "; NCCL-offset value ignored") : "");
  }
  /* A host whose table has 7 algorithms while the tuner was told (CCLKIT_RCCL_NUM_ALGO)
   * to expect 8: the tuner cannot undo init, but says so, once per communicator. */
  if (argc == 2) {
    const layout_t *l = &LAYOUTS[sizeof LAYOUTS / sizeof LAYOUTS[0] - 1];
    setenv("CCLKIT_FLAVOR", "rccl", 1);
    setenv("CCLKIT_RCCL_NUM_ALGO", "8", 1);
    tuner_t t = table_of(lib, l->symbol);
    double buf[PAD + MAXD + PAD];
    fill(l, buf + PAD);
    warns = 0;
    decide_na(l, t, buf, 4096, 7);
    CHECK(warns == 1);
    CHECK(strstr(last_warn, "host passes 7 algorithms but init assumed a 8-algorithm") != NULL);
    printf("tuner RCCL-8 layout with a 7-algorithm table: %d WARN: %s\n", warns, last_warn);
  }
  dlclose(lib);
  if (failures) { fprintf(stderr, "%d check(s) failed\n", failures); return 1; }
  return 0;
}
