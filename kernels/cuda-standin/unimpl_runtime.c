/*
 * The exported but unimplemented runtime functions (unimpl_runtime.def): each
 * fails with cudaErrorNotSupported, recorded as the thread's last error, after
 * naming itself once on stderr. Arguments are ignored (see unimpl.c).
 */
#include "runtime.h"

#define X(name)                                                                              \
  STANDIN_API cudaError_t name(void);                                                        \
  cudaError_t name(void) {                                                                   \
    standin_missing("libcudart", #name, cudaErrorNotSupported, "cudaErrorNotSupported");     \
    return rt_result(cudaErrorNotSupported);                                                 \
  }
#include "unimpl_runtime.def"
#undef X
