#!/usr/bin/env bash
# Checks that a packaged plugin exports exactly the expected versioned symbols, each
# as a data object (NCCL looks them up with dlsym and uses them as structs) of the
# exact table size for its ABI version.
#
# usage: check-symbols.sh LIB.so net|tuner|env|profiler
set -euo pipefail
lib=$1 kind=$2
case $kind in
  net)   prefix=ncclNetPlugin_v;   expected="6:136 7:152 8:152 9:160 10:160 11:176 12:176" ;;
  tuner) prefix=ncclTunerPlugin_v; expected="1:32 2:32 3:32 4:32 5:32 6:40" ;;
  env)   prefix=ncclEnvPlugin_v;   expected="1:32 2:32" ;;
  profiler) prefix=ncclProfiler_v;  expected="1:48 2:48 3:48 4:48 5:48 6:48 7:48" ;;
  *) echo "check-symbols: unknown kind '$kind' (net|tuner|env|profiler)" >&2; exit 2 ;;
esac
[ -f "$lib" ] || { echo "check-symbols: $lib: no such file" >&2; exit 1; }
# readelf --dyn-syms columns: Num Value Size Type Bind Vis Ndx Name
found=$(readelf -W --dyn-syms "$lib" | awk -v p="$prefix" '$8 ~ "^"p && $7 != "UND" {sub(/@.*/, "", $8); print $8, $4, $3}' | sort -u)
fail=0
for pair in $expected; do
  v=${pair%%:*} size=${pair##*:}
  line=$(printf '%s\n' "$found" | awk -v s="$prefix$v" '$1 == s')
  if [ -z "$line" ]; then echo "FAIL $lib: missing $prefix$v"; fail=1; continue; fi
  read -r _ type got <<<"$line"
  [ "$type" = OBJECT ] || { echo "FAIL $lib: $prefix$v is $type, must be a data OBJECT"; fail=1; }
  [ "$got" = "$size" ] || { echo "FAIL $lib: $prefix$v is $got bytes, the v$v table is $size"; fail=1; }
done
extra=$(printf '%s\n' "$found" | awk '{print $1}' | while read -r s; do
  v=${s#"$prefix"}; case " $expected " in *" $v:"*) ;; *) echo "$s";; esac; done)
[ -z "$extra" ] || { echo "FAIL $lib: unexpected symbols: $extra"; fail=1; }
# A library of one kind must not also carry another kind's symbols unless it is meant to.
for other in ncclNetPlugin_v ncclTunerPlugin_v ncclEnvPlugin_v ncclProfiler_v; do
  [ "$other" = "$prefix" ] && continue
  if readelf -W --dyn-syms "$lib" | awk '$7 != "UND"' | grep -q " $other"; then
    echo "FAIL $lib: unexpectedly exports ${other}*"; fail=1
  fi
done
[ $fail = 0 ] && echo "ok   $lib: $(printf '%s\n' "$found" | awk '{print $1}' | tr '\n' ' ')"
exit $fail
