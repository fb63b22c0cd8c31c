#!/usr/bin/env bash
# Lists every test that did not run, with its reason, from the logs of a test run
# (`make test` tees cargo's and the C tests' output into build/test-*.log):
#   * `#[ignore = "reason"]` tests: libtest prints `test NAME ... ignored, REASON`;
#   * run-time skips: a test that cannot run in this environment writes
#     `cclkit-skip: NAME: REASON` straight to stderr (not captured by libtest).
# An ignored test without a reason is listed as such: every skip must say why.
# CCLKIT_NO_SKIPS=1 turns any skip or ignored test into a failure (exit 1).
#
# usage: tests/skips.sh LOG...
set -euo pipefail
if [ $# = 0 ]; then
  echo "usage: $0 LOG..." >&2
  exit 2
fi
for log in "$@"; do
  [ -r "$log" ] || { echo "skips.sh: cannot read $log" >&2; exit 2; }
done

# Cargo announces each test binary with "Running <source> (<binary>)" or
# "Doc-tests <crate>"; remember it so each entry says where the test lives.
list=$(awk '
  /^ *Running / {
    where = $2
    if ($2 == "unittests") {  # "Running unittests src/lib.rs (…/deps/<crate>-<hash>)"
      bin = $4; gsub(/[()]/, "", bin); sub(/.*\//, "", bin); sub(/-[0-9a-f]+$/, "", bin)
      where = bin " " $3
    }
    next
  }
  /^ *Doc-tests / { where = "doc-tests " $2; next }
  /^test .* \.\.\. ignored/ {
    line = $0
    sub(/^test /, "", line)
    name = line; sub(/ \.\.\. ignored.*/, "", name)
    why = line; sub(/^.* \.\.\. ignored/, "", why); sub(/^, */, "", why)
    if (why == "" && where ~ /^doc-tests/) why = "doc example marked ignore (not compiled)"
    else if (why == "") why = "(no reason given: add #[ignore = \"why\"])"
    printf "ignored  %s: %s: %s\n", where, name, why
    next
  }
  /cclkit-skip: / {
    line = $0
    sub(/^.*cclkit-skip: /, "", line)
    printf "skipped  %s: %s\n", where, line
  }
' "$@")

echo "---- tests that did not run (ignored or skipped), with the reason ----"
if [ -z "$list" ]; then
  echo "none: every test ran"
  exit 0
fi
echo "$list"
n=$(wc -l <<<"$list")
echo "---- $n test(s) did not run ----"
if [ "${CCLKIT_NO_SKIPS:-0}" = 1 ]; then
  echo "CCLKIT_NO_SKIPS=1: a skipped or ignored test is a failure" >&2
  exit 1
fi
