/*
 * The ncclDebugLogger_t that cclkit hands to plugins.
 *
 * NCCL's logger is C-variadic (printf-style), which stable Rust cannot define, so this
 * shim formats the message with vsnprintf and passes the finished text to a Rust sink
 * (plugin/logger.rs), which turns it into a `tracing` event and remembers the last WARN
 * of each thread so that host-side errors can quote "the plugin's message".
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* ncclDebugLogLevel values (NCCL_ABI.md 1.2). */
#define CCLKIT_LOG_WARN 2
#define CCLKIT_LOG_ABORT 4

/* Messages longer than the stack buffer are formatted on the heap, up to this size. */
#define CCLKIT_LOG_MAX_HEAP (1u << 20)

typedef void (*cclkit_log_sink_fn)(int level, unsigned long flags, const char *file, int line,
                                   const char *msg, size_t len);

/* Set once by Rust (cclkit_log_install) before the logger is handed to any plugin. */
static cclkit_log_sink_fn sink;
/* Highest level worth formatting; WARN and ABORT are always formatted. */
static int max_level = 5;

void cclkit_log_install(cclkit_log_sink_fn fn, int level) {
  __atomic_store_n(&max_level, level, __ATOMIC_RELAXED);
  __atomic_store_n(&sink, fn, __ATOMIC_RELEASE);
}

void cclkit_nccl_logger(int level, unsigned long flags, const char *file, int line, const char *fmt,
                        ...) __attribute__((format(printf, 5, 6)));

void cclkit_nccl_logger(int level, unsigned long flags, const char *file, int line, const char *fmt,
                        ...) {
  cclkit_log_sink_fn out = __atomic_load_n(&sink, __ATOMIC_ACQUIRE);
  if (out == NULL) return;
  if (level != CCLKIT_LOG_WARN && level != CCLKIT_LOG_ABORT &&
      level > __atomic_load_n(&max_level, __ATOMIC_RELAXED))
    return;
  if (fmt == NULL) {
    out(level, flags, file, line, "(NULL format)", 13);
    return;
  }

  char stack[1024];
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  int n = vsnprintf(stack, sizeof stack, fmt, ap);
  va_end(ap);

  if (n < 0) {
    out(level, flags, file, line, "(unformattable log message)", 27);
  } else if ((size_t)n < sizeof stack) {
    out(level, flags, file, line, stack, (size_t)n);
  } else {
    size_t cap = (size_t)n + 1;
    if (cap > CCLKIT_LOG_MAX_HEAP) cap = CCLKIT_LOG_MAX_HEAP;
    char *heap = malloc(cap);
    if (heap != NULL) {
      int m = vsnprintf(heap, cap, fmt, again);
      size_t len = (m < 0) ? 0 : ((size_t)m < cap ? (size_t)m : cap - 1);
      out(level, flags, file, line, heap, len);
      free(heap);
    } else {
      out(level, flags, file, line, stack, sizeof stack - 1);
    }
  }
  va_end(again);
}
