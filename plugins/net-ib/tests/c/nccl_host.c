/* A minimal NCCL-like host: dlopen a net plugin, call init through the v12 and v8
 * tables with a real variadic logger, then dlclose. Prints one line per step for
 * the Rust test (tests/init_without_verbs.rs) to check. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line,
                         const char* fmt, ...);

static void logger(int level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  va_list ap;
  (void)flags;
  (void)file;
  (void)line;
  va_start(ap, fmt);
  printf("LOG level=%d ", level);
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
}

/* Only the leading slots are needed: name, init, devices. */
struct net_v12 {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, void* config, logger_t log, void* prof);
  ncclResult_t (*devices)(int* ndev);
};
struct net_v8 {
  const char* name;
  ncclResult_t (*init)(logger_t log);
  ncclResult_t (*devices)(int* ndev);
};

int main(int argc, char** argv) {
  if (argc != 2) return 64;
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    printf("DLOPEN_FAILED %s\n", dlerror());
    return 2;
  }
  struct net_v12* t12 = (struct net_v12*)dlsym(lib, "ncclNetPlugin_v12");
  struct net_v8* t8 = (struct net_v8*)dlsym(lib, "ncclNetPlugin_v8");
  if (!t12 || !t8) {
    printf("NO_SYMBOL\n");
    return 3;
  }
  printf("NAME %s\n", t12->name);
  void* ctx = NULL;
  int r = t12->init(&ctx, 7, NULL, logger, NULL);
  printf("V12_INIT %d CTX %s\n", r, ctx ? "set" : "null");
  r = t8->init(logger);
  printf("V8_INIT %d\n", r);
  int n = -1;
  r = t8->devices(&n);
  printf("V8_DEVICES %d %d\n", r, n);
  fflush(stdout);
  dlclose(lib);
  printf("DLCLOSED\n");
  return 0;
}
