/*
 * MPI_Allreduce baseline for `cclkit perf`: the same sweep, timing and bandwidth
 * maths as nccl-tests' all_reduce_perf (out-of-place, float sum), printed in the
 * same row format so one parser reads both.
 *
 *   mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 *   mpirun -np 4 --mca pml ob1 --mca btl tcp,self ./mpi_allreduce -b 8 -e 64M -f 2 -n 20 -w 5
 *
 * Flags: -b min bytes, -e max bytes (K/M/G suffixes), -f factor, -n iterations,
 * -w warmup iterations per size, -c 0|1 check the result, -T ms: raise the
 * iterations (up to 1000 x -n) so each size's timed loop lasts about ms
 * milliseconds, from one probe operation (the slowest rank's), exactly as
 * `cclkit perf --iter-time`. Time = mean over ranks of the per-op time;
 * busbw = algbw x 2(n-1)/n.
 */
#include <ctype.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t parse_size(const char *s) {
  char *end = NULL;
  double v = strtod(s, &end);
  size_t unit = 1;
  if (end && *end) {
    switch (toupper((unsigned char)*end)) {
    case 'K': unit = 1ull << 10; break;
    case 'M': unit = 1ull << 20; break;
    case 'G': unit = 1ull << 30; break;
    default: fprintf(stderr, "bad size '%s'\n", s); exit(2);
    }
  }
  return (size_t)(v * (double)unit);
}

/* Small integers: float sums of them are exact in any order. */
static float value(int rank, size_t i) { return (float)((i * 7 + (size_t)rank * 13) % 9) - 4.0f; }

int main(int argc, char **argv) {
  size_t minb = 8, maxb = 64ull << 20, factor = 2;
  int iters = 20, warmup = 5, check = 1;
  double iter_ms = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-b")) minb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-e")) maxb = parse_size(argv[i + 1]);
    else if (!strcmp(argv[i], "-f")) factor = (size_t)atol(argv[i + 1]);
    else if (!strcmp(argv[i], "-n")) iters = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-c")) check = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-T")) iter_ms = atof(argv[i + 1]);
    else { fprintf(stderr, "unknown flag %s\n", argv[i]); return 2; }
  }
  if (factor < 2 || iters < 1) { fprintf(stderr, "need -f >= 2 and -n >= 1\n"); return 2; }
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  size_t maxcount = maxb / sizeof(float);
  float *send = malloc((maxcount ? maxcount : 1) * sizeof(float));
  float *recv = malloc((maxcount ? maxcount : 1) * sizeof(float));
  if (!send || !recv) { fprintf(stderr, "out of memory\n"); MPI_Abort(MPI_COMM_WORLD, 1); }
  for (size_t i = 0; i < maxcount; i++) send[i] = value(rank, i);
  memset(recv, 0, (maxcount ? maxcount : 1) * sizeof(float));
  if (rank == 0) {
    printf("# mpi_allreduce: MPI_Allreduce float sum, %d ranks, iters %d warmup %d\n", n, iters, warmup);
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size", "count", "type", "redop", "root",
           "time", "algbw", "busbw", "#wrong");
    printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)", "(elements)", "", "", "", "(us)",
           "(GB/s)", "(GB/s)", "");
  }
  long wrong_total = 0;
  for (size_t bytes = minb; bytes <= maxb; bytes *= factor) {
    int count = (int)(bytes / sizeof(float));
    for (int w = 0; w < warmup; w++)
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int n_it = iters;
    if (iter_ms > 0) {
      double p0 = MPI_Wtime();
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double mine = MPI_Wtime() - p0, slowest = 0;
      MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (slowest < 1e-7) slowest = 1e-7;
      double want = iter_ms * 1e-3 / slowest;
      n_it = want > 1000.0 * iters ? 1000 * iters : (want < iters ? iters : (int)want + 1);
    } else {
      MPI_Barrier(MPI_COMM_WORLD);
    }
    double t0 = MPI_Wtime();
    for (int it = 0; it < n_it; it++)
      MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double per_op = (MPI_Wtime() - t0) / n_it, sum = 0;
    MPI_Allreduce(&per_op, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    double secs = sum / n;
    long wrong = 0;
    if (check) {
      for (int i = 0; i < count; i++) {
        float want = 0;
        for (int r = 0; r < n; r++) want += value(r, (size_t)i);
        if (recv[i] != want) wrong++;
      }
      long all = 0;
      MPI_Allreduce(&wrong, &all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
      wrong = all;
      wrong_total += all;
    }
    double algbw = (double)count * sizeof(float) / 1e9 / secs;
    double busbw = algbw * 2.0 * (n - 1) / n;
    if (rank == 0) {
      printf("%12zu  %12d  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6ld\n", (size_t)count * sizeof(float),
             count, "float", "sum", -1, secs * 1e6, algbw, busbw, check ? wrong : -1);
      fflush(stdout);
    }
    if (bytes == 0) break;
  }
  if (rank == 0) printf("# Out of bounds values : %ld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
  free(send);
  free(recv);
  MPI_Finalize();
  return wrong_total ? 1 : 0;
}
