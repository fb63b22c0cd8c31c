/*
 * Streams, events and stream capture. Every operation of the stand-in completes
 * before its call returns, so a stream is only a handle, every query reports
 * "done" and an event records the time it was recorded at (for
 * cuEventElapsedTime). Stream capture is never active.
 */
#include <stdlib.h>
#include <time.h>

#include "standin.h"

#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x45564e54U

struct standin_stream {
  unsigned magic;
  int device;
};
struct standin_event {
  unsigned magic;
  int recorded;
  double ms; /* CLOCK_MONOTONIC at record, in ms */
};

/* NULL is the legacy default stream; the two special handles 0x1/0x2 are the
 * legacy and per-thread default streams of cuda.h. */
int standin_valid_stream(CUstream s) {
  return s == NULL || (uintptr_t)s == 1 || (uintptr_t)s == 2 || s->magic == STREAM_MAGIC;
}

static CUresult stream_create(CUstream *s) {
  CHECK_INIT();
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  struct standin_stream *x = malloc(sizeof *x);
  if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
  *x = (struct standin_stream){STREAM_MAGIC, standin_current_device()};
  *s = x;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
  CU_TRACE("cuStreamCreate(flags=%u)", flags);
  return stream_create(s);
}

STANDIN_API CUresult cuStreamCreateWithPriority(CUstream *s, unsigned int flags, int priority) {
  CU_TRACE("cuStreamCreateWithPriority(flags=%u, priority=%d)", flags, priority);
  return stream_create(s);
}

STANDIN_API CUresult cuStreamDestroy_v2(CUstream s) {
  CU_TRACE("cuStreamDestroy_v2(%p)", (void *)s);
  CHECK_INIT();
  if (!s || (uintptr_t)s <= 2 || s->magic != STREAM_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
  s->magic = 0;
  free(s);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuStreamDestroy(CUstream s) { return cuStreamDestroy_v2(s); }

STANDIN_API CUresult cuStreamSynchronize(CUstream s) {
  CU_TRACE("cuStreamSynchronize(%p)", (void *)s);
  CHECK_INIT();
  return standin_valid_stream(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

STANDIN_API CUresult cuStreamQuery(CUstream s) {
  CU_TRACE("cuStreamQuery(%p)", (void *)s);
  CHECK_INIT();
  return standin_valid_stream(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

static int valid_event(CUevent e) { return e && e->magic == EVENT_MAGIC; }

STANDIN_API CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  CU_TRACE("cuStreamWaitEvent(%p, %p, flags=%u)", (void *)s, (void *)e, flags);
  CHECK_INIT();
  return standin_valid_stream(s) && valid_event(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

STANDIN_API CUresult cuEventCreate(CUevent *e, unsigned int flags) {
  CU_TRACE("cuEventCreate(flags=%u)", flags);
  CHECK_INIT();
  if (!e) return CUDA_ERROR_INVALID_VALUE;
  struct standin_event *x = calloc(1, sizeof *x);
  if (!x) return CUDA_ERROR_OUT_OF_MEMORY;
  x->magic = EVENT_MAGIC;
  *e = x;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventDestroy_v2(CUevent e) {
  CU_TRACE("cuEventDestroy_v2(%p)", (void *)e);
  CHECK_INIT();
  if (!valid_event(e)) return CUDA_ERROR_INVALID_HANDLE;
  e->magic = 0;
  free(e);
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

STANDIN_API CUresult cuEventRecord(CUevent e, CUstream s) {
  CU_TRACE("cuEventRecord(%p, %p)", (void *)e, (void *)s);
  CHECK_INIT();
  if (!valid_event(e) || !standin_valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  e->ms = (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
  e->recorded = 1;
  return CUDA_SUCCESS;
}

STANDIN_API CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags) {
  (void)flags;
  return cuEventRecord(e, s);
}

STANDIN_API CUresult cuEventSynchronize(CUevent e) {
  CU_TRACE("cuEventSynchronize(%p)", (void *)e);
  CHECK_INIT();
  return valid_event(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

STANDIN_API CUresult cuEventQuery(CUevent e) {
  CU_TRACE("cuEventQuery(%p)", (void *)e);
  CHECK_INIT();
  return valid_event(e) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

STANDIN_API CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end) {
  CU_TRACE("cuEventElapsedTime(%p, %p)", (void *)start, (void *)end);
  CHECK_INIT();
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_event(start) || !valid_event(end)) return CUDA_ERROR_INVALID_HANDLE;
  if (!start->recorded || !end->recorded) return CUDA_ERROR_INVALID_HANDLE;
  *ms = (float)(end->ms - start->ms);
  return CUDA_SUCCESS;
}

/* CUstreamCaptureMode: GLOBAL 0, THREAD_LOCAL 1, RELAXED 2; swapped per thread. */
static __thread int capture_mode;

STANDIN_API CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
  CU_TRACE("cuThreadExchangeStreamCaptureMode(%d)", mode ? *mode : -1);
  CHECK_INIT();
  if (!mode || *mode < 0 || *mode > 2) return CUDA_ERROR_INVALID_VALUE;
  int old = capture_mode;
  capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}

/* CUstreamCaptureStatus NONE: no capture ever runs here. */
STANDIN_API CUresult cuStreamIsCapturing(CUstream s, int *status) {
  CU_TRACE("cuStreamIsCapturing(%p)", (void *)s);
  CHECK_INIT();
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  if (!standin_valid_stream(s)) return CUDA_ERROR_INVALID_HANDLE;
  *status = 0;
  return CUDA_SUCCESS;
}
