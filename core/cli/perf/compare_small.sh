#!/usr/bin/env bash
# Small-message latency, cclkit perf against Open MPI, alternated round by round.
#
#   core/cli/perf/compare_small.sh [cclkit binary...]     (default target/release/cclkit)
#
# compare.sh keeps each side's best time over a few runs; on a shared machine whose
# speed moves by 10-30 % from minute to minute that can pick the two sides from
# different minutes. Here every round runs each cclkit binary, then MPI, at one size,
# back to back, and the summary is the median of the per-round ratios (cclkit time /
# MPI time, < 1 means cclkit is faster), next to each side's median and best time.
# Several binaries (say, before and after a change) are measured in the same rounds.
#
# Environment: ROUNDS [15]  NP [2]  BYTES [8]  ITER_TIME [300] (ms per measurement)
#              HIGH_PRIORITY [1] (autogroup nice -20 for both sides)  MPI_IF [lo]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${ROUNDS:-15} NP=${NP:-2} BYTES=${BYTES:-8} ITER_TIME=${ITER_TIME:-300}
HIGH_PRIORITY=${HIGH_PRIORITY:-1} MPI_IF=${MPI_IF:-lo}
command -v python3 >/dev/null || { echo "python3 not found: apt-get install -y python3" >&2; exit 2; }
# shellcheck source=mpi_side.sh
. "$here/mpi_side.sh"
bins=("$@")
[[ ${#bins[@]} -gt 0 ]] || bins=("$(default_cclkit)")
for b in "${bins[@]}"; do
  [[ -x "$b" ]] || { echo "no cclkit binary at $b (cargo build --release -p cclkit-cli)" >&2; exit 2; }
done
# The out-of-place time of the one size, or "fail".
time_of() { awk -v b="$BYTES" '$1 == b && /^ +[0-9]/ { print $6; f = 1 } END { if (!f) print "fail" }'; }
echo "# $NP ranks, all_reduce float sum, $BYTES B, $ROUNDS rounds; load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < ROUNDS; r++)); do
  row=""
  for b in "${bins[@]}"; do
    t=$(prio "$b" perf --np "$NP" -b "$BYTES" -e "$BYTES" -n 5 -w 5 --iter-time "$ITER_TIME" \
      --no-progress 2>"$work/err" | time_of)
    [[ "$t" != fail ]] || { cat "$work/err" >&2; exit 1; }
    row="$row $t"
  done
  t=$(prio mpirun "${mpirun_flags[@]}" -np "$NP" "$work/mpi_allreduce" -b "$BYTES" -e "$BYTES" \
    -n 5 -w 5 -T "$ITER_TIME" 2>"$work/err" | time_of)
  [[ "$t" != fail ]] || { cat "$work/err" >&2; exit 1; }
  echo "round $r:$row $t"
  echo "$row $t" >>"$work/rows"
done
python3 - "$work/rows" "${bins[@]}" <<'PY'
import statistics as st, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
names = sys.argv[2:] + ["MPI"]
for i, n in enumerate(names):
    col = [r[i] for r in rows]
    print(f"# {n}: median {st.median(col):.2f} us, best {min(col):.2f} us")
for i, n in enumerate(names[:-1]):
    q = sorted(r[i] / r[-1] for r in rows)
    print(f"# {n} / MPI time per round: median {st.median(q):.3f} (range {q[0]:.3f}-{q[-1]:.3f})")
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
