/*
 * The exported but unimplemented driver functions (unimpl_driver.def). Each takes
 * whatever arguments its caller passes (all are ignored: on the x86-64 and AArch64
 * C ABIs the result register is the same for any parameter list) and fails with
 * CUDA_ERROR_NOT_SUPPORTED after naming itself once on stderr.
 */
#include "standin.h"

#define X(name)                                                                    \
  STANDIN_API CUresult name(void);                                                 \
  CUresult name(void) {                                                            \
    standin_missing("libcuda", #name, CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"); \
    return CUDA_ERROR_NOT_SUPPORTED;                                               \
  }
#include "unimpl_driver.def"
#undef X
