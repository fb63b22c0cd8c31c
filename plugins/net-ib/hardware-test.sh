#!/usr/bin/env bash
# Two-host hardware test of the cclkit-ib net plugin. See plugins/net-ib/HARDWARE.md.
#
#   plugins/net-ib/hardware-test.sh [options] HOST_A HOST_B
#
# Run from the repository root on HOST_A; the repository must be built (`make`) at the
# same path on both hosts, with passwordless ssh between them and Open MPI's mpirun.
set -euo pipefail

SO=build/lib/libnccl-net-cclkit-ib.so
CCLKIT=target/release/cclkit
LOOPBACK=0
HCA=""
QPS=""
MAX_BYTES=1G
LOGS=cclkit-ib-hw-logs

usage() {
  sed -n '2,7p' "$0"
  echo "options: --so PATH --cclkit PATH --loopback --hca NCCL_IB_HCA --qps N --max-bytes SIZE"
  exit 64
}

while [ $# -gt 0 ]; do
  case "$1" in
    --so) SO=$2; shift 2 ;;
    --cclkit) CCLKIT=$2; shift 2 ;;
    --loopback) LOOPBACK=1; shift ;;
    --hca) HCA=$2; shift 2 ;;
    --qps) QPS=$2; shift 2 ;;
    --max-bytes) MAX_BYTES=$2; shift 2 ;;
    -h|--help) usage ;;
    -*) echo "unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -eq 2 ] || usage
HOST_A=$1
HOST_B=$2
REPO=$(pwd)
SO=$(realpath -m "$SO")
CCLKIT=$(realpath -m "$CCLKIT")
mkdir -p "$LOGS"

# Environment every step runs with.
ENV_VARS=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET)
[ -n "$HCA" ] && ENV_VARS+=("NCCL_IB_HCA=$HCA")
[ -n "$QPS" ] && ENV_VARS+=("NCCL_IB_QPS_PER_CONNECTION=$QPS")

pass() { printf 'PASS  %s\n' "$*"; }
fail() { printf 'FAIL  %s\n' "$*"; exit 1; }

on() { # on HOST CMD... : run in the repo on HOST with the test environment
  local host=$1; shift
  ssh -o BatchMode=yes "$host" "cd $(printf %q "$REPO") && env ${ENV_VARS[*]} $*"
}

[ -f "$SO" ] || fail "plugin $SO not found (run make)"
[ -x "$CCLKIT" ] || fail "cclkit binary $CCLKIT not found (run make)"

# 1. Device preflight.
for h in "$HOST_A" "$HOST_B"; do
  if on "$h" ibv_devinfo >"$LOGS/ibv_devinfo.$h.log" 2>&1 \
     && grep -q PORT_ACTIVE "$LOGS/ibv_devinfo.$h.log"; then
    pass "1 $h has an active RDMA port"
  else
    fail "1 $h: no active RDMA port (see $LOGS/ibv_devinfo.$h.log)"
  fi
done

# 2. libibverbs must be opened at run time, never linked.
if readelf -dW "$SO" | grep NEEDED | grep -q ibverbs; then
  fail "2 $SO links libibverbs (it must dlopen it)"
fi
pass "2 no DT_NEEDED on libibverbs"

# 3. Conformance through the v12 and v8 tables on each host.
for h in "$HOST_A" "$HOST_B"; do
  for v in 12 8; do
    log="$LOGS/check.$h.v$v.json"
    if on "$h" "$CCLKIT" check "$SO" --version "$v" --json >"$log" 2>"$log.stderr"; then
      pass "3 $h cclkit check --version $v"
    else
      fail "3 $h cclkit check --version $v (see $log, $log.stderr)"
    fi
  done
done

# 4. Optional single-host loopback through the real verbs backend.
if [ "$LOOPBACK" = 1 ]; then
  for h in "$HOST_A" "$HOST_B"; do
    log="$LOGS/loopback.$h.log"
    if on "$h" cargo test --release -p cclkit-net-ib --test hardware_loopback \
         -- --ignored --test-threads=1 >"$log" 2>&1 && grep -q "1 passed" "$log"; then
      pass "4 $h loopback transfers"
    else
      fail "4 $h loopback test (see $log)"
    fi
  done
fi

# 5. Two-host bandwidth and correctness over the plugin.
MPI_ENV=(-x NCCL_NET_PLUGIN="$SO" -x NCCL_NET=cclkit-ib)
for kv in "${ENV_VARS[@]}"; do MPI_ENV+=(-x "$kv"); done
log="$LOGS/perf.log"
if mpirun -np 2 -H "$HOST_A:1,$HOST_B:1" --wdir "$REPO" "${MPI_ENV[@]}" \
     "$CCLKIT" perf --net cclkit-ib -b 8 -e "$MAX_BYTES" -f 2 >"$log" 2>&1; then
  if grep -q "Out of bounds values : 0 OK" "$log"; then
    pass "5 perf: no wrong values; $(grep -m1 'Avg bus bandwidth' "$log" || echo 'see log')"
  else
    fail "5 perf finished but reported wrong values or no footer (see $log)"
  fi
else
  fail "5 perf failed (see $log)"
fi

# 6. A filter that matches nothing: init must fail cleanly with the reason.
log="$LOGS/check.filtered.log"
if ssh -o BatchMode=yes "$HOST_A" "cd $(printf %q "$REPO") && env NCCL_DEBUG=INFO NCCL_IB_HCA==no_such_hca $CCLKIT check $SO --version 12" >"$log" 2>&1; then
  fail "6 check passed although NCCL_IB_HCA matches no device (see $log)"
elif grep -q "no active port on the RDMA devices" "$log"; then
  pass "6 filtered-out HCA: init fails cleanly with the reason"
else
  fail "6 no clean init failure message (see $log)"
fi

# 7. Optional: real NCCL through nccl-tests.
if [ -n "${NCCL_TESTS_DIR:-}" ]; then
  log="$LOGS/nccl-tests.log"
  if mpirun -np 2 -H "$HOST_A:1,$HOST_B:1" --wdir "$REPO" "${MPI_ENV[@]}" \
       "$NCCL_TESTS_DIR/all_reduce_perf" -b 8 -e "$MAX_BYTES" -f 2 -g 1 >"$log" 2>&1 \
     && grep -qi "cclkit-ib" "$log" && grep -q "Out of bounds values : 0 OK" "$log"; then
    pass "7 nccl-tests all_reduce_perf over cclkit-ib"
  else
    fail "7 nccl-tests over cclkit-ib (see $log)"
  fi
fi

echo "all steps passed; logs in $LOGS/"
