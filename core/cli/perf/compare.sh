#!/usr/bin/env bash
# cclkit perf vs Open MPI's MPI_Allreduce over TCP, on the same local ranks and sizes.
#
#   core/cli/perf/compare.sh [path/to/cclkit]        (or: make perf-compare)
#
# For each rank count, runs `cclkit perf --np N` (all_reduce, float sum, out-of-place
# column) and `mpirun -np N mpi_allreduce` (built here with mpicc; TCP forced with
# `--mca pml ob1 --mca btl tcp,self`), alternately REPEAT times, keeps each side's
# best time per size, and prints busbw side by side with cclkit/MPI ratios, then the
# 8-byte latency and the ratios at >= 1 MiB.
#
# Environment (defaults in brackets):
#   NPS ["2 4"]  MINB [8]  MAXB [64M]  ITERS [5]  WARMUP [2]  ITER_TIME [100] (ms)
#   REPEAT [1]   MPI_IF [lo] (btl_tcp_if_include; cclkit --np also uses lo)
#   HIGH_PRIORITY [0]: 1 runs both in a new session with autogroup nice -20 (root),
#                 so that other work on a shared machine disturbs both sides less.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
NPS=${NPS:-"2 4"}
MINB=${MINB:-8}
MAXB=${MAXB:-64M}
ITERS=${ITERS:-5}
WARMUP=${WARMUP:-2}
ITER_TIME=${ITER_TIME:-100}
REPEAT=${REPEAT:-1}
MPI_IF=${MPI_IF:-lo}
HIGH_PRIORITY=${HIGH_PRIORITY:-0}

# shellcheck source=mpi_side.sh
. "$here/mpi_side.sh"
cclkit=${1:-${CCLKIT:-$(default_cclkit)}}
[[ -x "$cclkit" ]] || { echo "no cclkit binary at $cclkit (cargo build --release -p cclkit-cli, or pass its path)" >&2; exit 2; }
cc -O2 -o "$work/tcp_exchange" "$here/tcp_exchange.c"

# Rows of an nccl-tests style table as "size time busbw" (out-of-place columns).
rows() { awk '/^ +[0-9]/ { print $1, $6, $8 }'; }

# Keeps the best (smallest) time per size over runs: "size time busbw" lines in,
# same out.
best() { sort -k1,1n -k2,2g | awk '!seen[$1]++'; }

echo "# cclkit perf vs Open MPI MPI_Allreduce (TCP: pml ob1, btl tcp,self, if $MPI_IF)"
echo "# $("$cclkit" --version), $(mpirun --version 2>/dev/null | head -1)"
echo "# sizes $MINB..$MAXB x2, -n $ITERS -w $WARMUP, iterations raised to ~${ITER_TIME} ms per size, best of $REPEAT"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
status=0
for np in $NPS; do
  : >"$work/c.$np"
  : >"$work/m.$np"
  for ((r = 0; r < REPEAT; r++)); do
    prio "$cclkit" perf --np "$np" -b "$MINB" -e "$MAXB" -f 2 -n "$ITERS" -w "$WARMUP" \
      --iter-time "$ITER_TIME" --no-progress >"$work/c.out" 2>"$work/c.err" ||
      { cat "$work/c.err" >&2; status=1; }
    rows <"$work/c.out" >>"$work/c.$np"
    prio mpirun "${mpirun_flags[@]}" -np "$np" "$work/mpi_allreduce" -b "$MINB" -e "$MAXB" -f 2 \
      -n "$ITERS" -w "$WARMUP" -T "$ITER_TIME" >"$work/m.out" 2>"$work/m.err" ||
      { cat "$work/m.err" >&2; status=1; }
    rows <"$work/m.out" >>"$work/m.$np"
  done
  best <"$work/c.$np" >"$work/cb.$np"
  best <"$work/m.$np" >"$work/mb.$np"
  echo "#"
  echo "# $np ranks: all_reduce float sum, out-of-place"
  printf "# %10s  %10s  %10s  %9s  %9s  %7s\n" "size (B)" "MPI us" "cclkit us" "MPI busbw" "cclk busbw" "ratio"
  awk 'NR == FNR { t[$1] = $2; b[$1] = $3; next } ($1 in t) { print $1, t[$1], b[$1], $2, $3 }' \
    "$work/mb.$np" "$work/cb.$np" | awk -v np="$np" '
    # Same bytes and factor on both sides: the busbw ratio is the inverse time ratio
    # (exact, where the printed busbw columns are rounded to 0.01 GB/s).
    { mt = $2; ct = $4; mb = $3; cb = $5
      ratio = (ct > 0) ? sprintf("%7.2f", mt / ct) : "      -"
      printf "  %10d  %10.2f  %10.2f  %9.2f  %9.2f  %s\n", $1, mt, ct, mb, cb, ratio
      if ($1 == 8) { lat = sprintf("# %d ranks, 8 B: MPI %.2f us, cclkit %.2f us (cclkit/MPI time %.2f)", np, mt, ct, ct / mt) }
      if ($1 >= 1048576 && ct > 0) { r = mt / ct; n++; lsum += log(r); if (min == "" || r < min) min = r; if (r > max) max = r }
    }
    END {
      if (lat != "") print lat
      if (n > 0) printf "# %d ranks, >= 1 MiB: busbw cclkit/MPI geometric mean %.2f, min %.2f, max %.2f over %d sizes\n", np, exp(lsum / n), min, max, n
    }'
done
# The floor under the 8-byte rows on 2 ranks: a bare 8-byte exchange in C over the
# two connection models (MPI: one socket per peer pair; NCCL's net API: a one-way
# send comm and a one-way receive comm, so each message costs a pure ACK), and the
# one-way model with the receiver's ACKs delayed, as cclkit-socket runs it.
echo "#"
echo "# raw TCP 8-byte exchange between 2 processes, best of $REPEAT (core/cli/perf/tcp_exchange.c):"
for ((r = 0; r < REPEAT; r++)); do prio "$work/tcp_exchange" 100000; done |
  awk -F': ' '{ split($2, f, " "); if (!($1 in t) || f[1] < t[$1]) t[$1] = f[1]; if (!($1 in o)) o[$1] = n++ }
    END { for (k in t) line[o[k]] = sprintf("#   %s: %.2f us", k, t[k]); for (i = 0; i < n; i++) print line[i] }' ||
  status=1
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
exit $status
