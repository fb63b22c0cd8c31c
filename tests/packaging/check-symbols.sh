#!/usr/bin/env bash
# Checks that a packaged plugin exports exactly the expected versioned symbols, each
# as a data object (NCCL looks them up with dlsym and uses them as structs) of the
# exact table size for its ABI version.
#
# usage: check-symbols.sh LIB.so net|tuner
set -euo pipefail
lib=$1 kind=$2
case $kind in
  net)   prefix=ncclNetPlugin_v;   expected="6:136 7:152 8:152 9:160 10:160 11:176 12:176" ;;
  tuner) prefix=ncclTunerPlugin_v; expected="1:32 2:32 3:32 4:32 5:32 6:40" ;;
  *) echo "check-symbols: unknown kind '$kind' (net|tuner)" >&2; exit 2 ;;
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
# A net library must not also carry tuner symbols unless it is meant to (and vice versa).
other=$([ "$kind" = net ] && echo ncclTunerPlugin_v || echo ncclNetPlugin_v)
if readelf -W --dyn-syms "$lib" | awk '$7 != "UND"' | grep -q " $other"; then
  echo "FAIL $lib: unexpectedly exports ${other}*"; fail=1
fi
[ $fail = 0 ] && echo "ok   $lib: $(printf '%s\n' "$found" | awk '{print $1}' | tr '\n' ' ')"
exit $fail
