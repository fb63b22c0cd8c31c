#!/usr/bin/env bash
# Prints every packaged plugin with the ABI versions it exports, read from the .so files.
# usage: inventory.sh DIR
set -euo pipefail
dir=${1:-build/lib}
printf '%-36s %-6s %s\n' "library" "kind" "exported ABI versions (newest first)"
for lib in "$dir"/*.so; do
  [ -L "$lib" ] && continue
  syms=$(readelf -W --dyn-syms "$lib" | awk '$7 != "UND" && $4 == "OBJECT" {print $8}')
  for kind in NetPlugin CollNetPlugin TunerPlugin EnvPlugin Profiler; do
    vs=$(printf '%s\n' "$syms" | sed -n "s/^nccl${kind}_v\([0-9]*\).*/\1/p" | sort -rn | sed 's/^/v/' | tr '\n' ' ')
    if [ -n "$vs" ]; then printf '%-36s %-6s %s\n' "$(basename "$lib")" "$(echo ${kind%Plugin} | tr A-Z a-z)" "$vs"; fi
  done
done
