#!/usr/bin/env bash
# Runs every libFuzzer target of a build for a bounded time.
# Usage: tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET=60] [extra libFuzzer flags]
# First each target replays its seed corpus (tests/fuzz/corpus/<target>)
# once, and some seeds must take effect (a committed step, an import, a
# release, an export: the seeds still reach the engine's success paths); then it fuzzes from a scratch copy of the corpus for SECONDS.
# A crash, a leak or a broken invariant (an abort in fuzz_common.h) leaves
# the reproducer in BUILD_DIR/fuzz-artifacts/ and fails the run; replay it
# with  BUILD_DIR/tests/fuzz/fuzz_<target> FILE. FUZZ_JOBS (default nproc)
# targets run side by side, each on its own core for its whole SECONDS.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:?usage: run.sh BUILD_DIR [SECONDS] [libFuzzer flags]}
secs=${2:-60}
shift $(($# >= 2 ? 2 : $#))
art="$build/fuzz-artifacts"
mkdir -p "$art"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
# One target ($1; the rest: libFuzzer flags): its seed replay, then SECONDS
# of fuzzing. Prints to stdout; the caller keeps each target's lines
# together.
fuzz_one() {
  local t=$1
  shift
  local bin="$build/tests/fuzz/fuzz_$t"
  local seeds="tests/fuzz/corpus/$t"
  local stats effect work t_secs rc
  stats=$(INDEXER_FUZZ_STATS=1 "$bin" "$seeds"/* 2>&1 | tee "$art/$t.replay.log" |
          grep 'fuzz stats' || true)
  echo "fuzz_$t seeds: ${stats:-no stats (see $art/$t.replay.log)}"
  effect=$(sed -n 's/.*took effect \([0-9]*\).*/\1/p' <<<"$stats")
  if [[ -z "$effect" || "$effect" -eq 0 ]]; then
    echo "fuzz_$t: no seed input takes effect (a commit, an import, a release)"
    tail -n 40 "$art/$t.replay.log"
    return 1
  fi
  work="$build/fuzz-corpus/$t"
  mkdir -p "$work"
  cp -n "$seeds"/* "$work"/
  # The skeleton reader has no engine behind it: a third of the time (<= 20 s).
  t_secs=$secs
  [[ $t == step_wire ]] && t_secs=$(( secs / 3 > 20 ? 20 : (secs / 3 > 0 ? secs / 3 : 1) ))
  echo "fuzz_$t: ${t_secs}s"
  rc=0
  "$bin" -max_total_time="$t_secs" -max_len=524288 -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$art/$t-" "$@" "$work" >"$art/$t.log" 2>&1 || rc=$?
  grep -E '^(#[0-9]+ *(DONE|INITED)|stat::(number_of_executed_units|peak_rss_mb|new_units_added)|SUMMARY|fuzz invariant)' \
    "$art/$t.log" || true
  if ((rc != 0)); then
    echo "fuzz_$t failed (exit $rc); the last lines of $art/$t.log:"
    tail -n 60 "$art/$t.log"
    return "$rc"
  fi
}

# FUZZ_JOBS targets at a time (default: one per core), each for its whole
# SECONDS on a core of its own; each target's lines are printed together
# when it ends, and the first failure fails the run (after the others end).
jobs=${FUZZ_JOBS:-$(nproc)}
failed=0
declare -A pid_of=()
finish_one() {
  local pid t rc=0
  wait -n -p pid "${!pid_of[@]}" || rc=$?
  t=${pid_of[$pid]}
  unset "pid_of[$pid]"
  cat "$art/$t.out"
  if ((rc != 0)); then echo "fuzz_$t: FAILED (exit $rc)" >&2; failed=1; fi
}
for t in step release write_entries export step_wire; do
  while ((${#pid_of[@]} >= jobs)); do finish_one; done
  fuzz_one "$t" "$@" >"$art/$t.out" 2>&1 &
  pid_of[$!]=$t
done
while ((${#pid_of[@]})); do finish_one; done
exit "$failed"
