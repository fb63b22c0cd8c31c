# Sourced by compare.sh and compare_small.sh: the Open MPI side both run and the
# helpers around it. Expects `here` (this directory), MPI_IF and HIGH_PRIORITY;
# sets `work` (removed on exit), builds "$work/mpi_allreduce", fills `mpirun_flags`
# and defines `prio` and `default_cclkit`.

for tool in mpicc mpirun; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install -y openmpi-bin libopenmpi-dev" >&2; exit 2; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/mpi_allreduce" "$here/mpi_allreduce.c"

# TCP forced on both sides' interface; root needs Open MPI's explicit consent.
mpirun_flags=(--oversubscribe --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include "$MPI_IF")
[[ $(id -u) == 0 ]] && mpirun_flags+=(--allow-run-as-root)

# Runs "$@" at high priority when asked (a new session gets its own autogroup).
prio() {
  if [[ "$HIGH_PRIORITY" == 1 ]]; then
    setsid -w bash -c 'echo -20 > /proc/self/autogroup 2>/dev/null; exec "$@"' prio "$@"
  else
    "$@"
  fi
}

# The workspace's release cclkit (its target directory, wherever cargo puts it).
default_cclkit() {
  local repo target
  repo=$(cd "$here/../../.." && pwd)
  target=$(cd "$repo" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
  echo "${target:-$repo/target}/release/cclkit"
}
