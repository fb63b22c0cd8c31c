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
# Several binaries (say, before and after a change) are measured in the same rounds,
# in an order reversed every other round; each later binary is also compared with the
# first one round by round (its time / the first's, and in how many rounds it won).
# MPI=0 leaves MPI out (a plain before/after comparison, twice as many rounds a minute).
#
# Environment: ROUNDS [15]  NP [2]  BYTES [8]  ITER_TIME [300] (ms per measurement)
#              HIGH_PRIORITY [1] (autogroup nice -20 for both sides)  MPI_IF [lo]  MPI [1]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${ROUNDS:-15} NP=${NP:-2} BYTES=${BYTES:-8} ITER_TIME=${ITER_TIME:-300}
HIGH_PRIORITY=${HIGH_PRIORITY:-1} MPI_IF=${MPI_IF:-lo} MPI=${MPI:-1}
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
cclkit_time() {
  local t
  t=$(prio "$1" perf --np "$NP" -b "$BYTES" -e "$BYTES" -n 5 -w 5 --iter-time "$ITER_TIME" \
    --no-progress 2>"$work/err" | time_of)
  [[ "$t" != fail ]] || { cat "$work/err" >&2; exit 1; }
  echo "$t"
}
for ((r = 0; r < ROUNDS; r++)); do
  times=()
  order=("${!bins[@]}")
  if ((r % 2)); then
    order=()
    for ((i = ${#bins[@]} - 1; i >= 0; i--)); do order+=("$i"); done
  fi
  for i in "${order[@]}"; do
    times[i]=$(cclkit_time "${bins[i]}")
  done
  row=" ${times[*]}"
  if [[ "$MPI" == 1 ]]; then
    t=$(prio mpirun "${mpirun_flags[@]}" -np "$NP" "$work/mpi_allreduce" -b "$BYTES" -e "$BYTES" \
      -n 5 -w 5 -T "$ITER_TIME" 2>"$work/err" | time_of)
    [[ "$t" != fail ]] || { cat "$work/err" >&2; exit 1; }
    row="$row $t"
  fi
  echo "round $r:$row"
  echo "$row" >>"$work/rows"
done
python3 - "$work/rows" "$MPI" "${bins[@]}" <<'PY'
import statistics as st, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
mpi = sys.argv[2] == "1"
bins = sys.argv[3:]
names = bins + (["MPI"] if mpi else [])
for i, n in enumerate(names):
    col = [r[i] for r in rows]
    print(f"# {n}: median {st.median(col):.2f} us, best {min(col):.2f} us")
if mpi:
    for i, n in enumerate(bins):
        q = sorted(r[i] / r[-1] for r in rows)
        print(f"# {n} / MPI time per round: median {st.median(q):.3f} (range {q[0]:.3f}-{q[-1]:.3f})")
for i, n in enumerate(bins[1:], start=1):
    q = sorted(r[i] / r[0] for r in rows)
    won = sum(1 for x in q if x < 1)
    print(f"# {n} / {bins[0]} time per round: median {st.median(q):.3f} "
          f"(middle half {q[len(q) // 4]:.3f}-{q[(3 * len(q)) // 4]:.3f}); faster in {won} of {len(q)} rounds")
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
