/*
 * Tracing and the report of unimplemented calls, compiled into both stand-in
 * libraries (each keeps its own copy of this state).
 *
 *   CCLKIT_CUDA_STANDIN_TRACE=1   log every call to stderr
 *
 * An unimplemented call is printed once per name, whatever the trace setting:
 * the stand-in must never be the silent reason a plugin misbehaves.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "standin.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* Names already reported; a plugin calling the same missing function in a loop
 * gets one line, not thousands. */
static const char *reported[256];
static int n_reported;
static const char *last_missing;

int standin_tracing(void) {
  static int cached = -1;
  if (cached < 0) {
    const char *v = getenv("CCLKIT_CUDA_STANDIN_TRACE");
    cached = v && *v && strcmp(v, "0") != 0;
  }
  return cached;
}

void standin_trace(const char *lib, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One write per line so lines of concurrent threads do not interleave. */
  fprintf(stderr, "cclkit cuda-standin %s: %s\n", lib, line);
}

int standin_missing(const char *lib, const char *name, int code, const char *code_name) {
  int first = 1, kept = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < n_reported; i++) {
    if (reported[i] == name || strcmp(reported[i], name) == 0) { first = 0; break; }
  }
  if (first && n_reported < (int)(sizeof reported / sizeof reported[0])) {
    reported[n_reported++] = name;
    kept = 1;
  }
  if (kept) last_missing = name; /* only kept names outlive this call */
  pthread_mutex_unlock(&lock);
  if (first || standin_tracing())
    fprintf(stderr,
            "cclkit cuda-standin %s: %s is not implemented by the stand-in: returning %s (%d); "
            "see docs/cuda-standin.md to add it\n",
            lib, name, code_name, code);
  return kept;
}

const char *standin_last_missing(void) {
  pthread_mutex_lock(&lock);
  const char *n = last_missing;
  pthread_mutex_unlock(&lock);
  return n;
}

const char *standin_numbered(const char *stem, int n) {
  /* Kept for the life of the process: the report table keeps the pointer. */
  static struct { const char *stem; int n; char text[64]; } names[128];
  static int used;
  const char *found = NULL;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < used && !found; i++)
    if (names[i].n == n && strcmp(names[i].stem, stem) == 0) found = names[i].text;
  if (!found && used < (int)(sizeof names / sizeof names[0])) {
    names[used].stem = stem;
    names[used].n = n;
    snprintf(names[used].text, sizeof names[used].text, "%s(attribute %d)", stem, n);
    found = names[used++].text;
  }
  pthread_mutex_unlock(&lock);
  return found ? found : stem;
}

int standin_env_int(const char *name, int fallback, int lo, int hi) {
  const char *v = getenv(name);
  if (!v || !*v) return fallback;
  char *end = NULL;
  long x = strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi) {
    fprintf(stderr, "cclkit cuda-standin: %s=%s is not an integer in %d..%d; using %d\n", name, v, lo, hi,
            fallback);
    return fallback;
  }
  return (int)x;
}
