/*
 * Entry-point lookup: cuGetProcAddress (CUDA 11.3 form and the CUDA 12 _v2 form).
 *
 * A plugin asks for a driver function by its base name ("cuMemAlloc") and gets the
 * newest ABI version of it ("cuMemAlloc_v2"). The stand-in answers from its own
 * exports: it tries NAME_v3, NAME_v2 and NAME in its own library, and only accepts
 * an address inside that library (the lookup handle also sees libc). So every
 * function the library exports, implemented or not, resolves to the stand-in's
 * own code; a name it does not export fails with CUDA_ERROR_NOT_FOUND and is
 * reported once. The requested CUDA version and the per-thread-stream flag are
 * not used: one version of each function exists here.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

/* CUdriverProcAddressQueryResult. */
enum { PROC_SUCCESS = 0, PROC_SYMBOL_NOT_FOUND = 1 };

STANDIN_API CUresult cuInit(unsigned int flags);

/* The base address of this library, found once through one of its functions. */
static void *self_base(void) {
  static void *base;
  if (!base) {
    Dl_info info;
    if (dladdr((void *)cuInit, &info)) base = info.dli_fbase;
  }
  return base;
}

static void *own_symbol(const char *name) {
  void *f = dlsym(RTLD_DEFAULT, name);
  Dl_info info;
  /* RTLD_DEFAULT may find another library's function of the same name first (a
   * real libcuda loaded too): only this library's own code is acceptable. */
  if (!f || !dladdr(f, &info) || info.dli_fbase != self_base()) {
    Dl_info me;
    if (!dladdr((void *)cuInit, &me)) return NULL;
    void *h = dlopen(me.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (!h) return NULL;
    f = dlsym(h, name);
    dlclose(h);
    if (!f || !dladdr(f, &info) || info.dli_fbase != self_base()) return NULL;
  }
  return f;
}

void *standin_proc(const char *symbol) {
  if (!symbol || strncmp(symbol, "cu", 2) != 0 || strlen(symbol) > 120) return NULL;
  static const char *suffixes[] = {"_v3", "_v2", ""};
  for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
    char name[128];
    snprintf(name, sizeof name, "%s%s", symbol, suffixes[i]);
    void *f = own_symbol(name);
    if (f) return f;
  }
  return NULL;
}

static CUresult lookup(const char *who, const char *symbol, void **pfn, int version, cuuint64_t flags,
                       int *status) {
  CU_TRACE("%s(\"%s\", version=%d, flags=%llu)", who, symbol ? symbol : "(null)", version, flags);
  if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
  void *f = standin_proc(symbol);
  *pfn = f;
  if (status) *status = f ? PROC_SUCCESS : PROC_SYMBOL_NOT_FOUND;
  if (!f) {
    /* Kept for the once-per-name report; bounded by the report table's size. */
    char *name = malloc(strlen(symbol) + 40);
    if (name) {
      sprintf(name, "%s (looked up by entry point)", symbol);
      if (!standin_missing("libcuda", name, CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND")) free(name);
    }
    return CUDA_ERROR_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, cuuint64_t flags) {
  return lookup("cuGetProcAddress", symbol, pfn, version, flags, NULL);
}

STANDIN_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                         int *status) {
  return lookup("cuGetProcAddress_v2", symbol, pfn, version, flags, status);
}
