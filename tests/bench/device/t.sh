#!/bin/bash
# Top-k A/B in one call: the suite, memcheck and racecheck on the top-k
# routes, then the decode shapes with bench_old (an older indexer_gpu_bench)
# and the new one, alternated twice.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../dev-lib:$LD_LIBRARY_PATH
timeout 120 ./gpu_backend_test > $OUT/test.log 2>&1; echo "test rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/test.log | head -20
F='*GpuTopkKernelTest*:*fp8_E64_B1_q1to1_n40000*:*mxfp4_E128_B2_q1to1_n40000*'
timeout 100 compute-sanitizer --tool memcheck --leak-check no ./gpu_backend_test --gtest_filter="$F" > $OUT/memcheck.log 2>&1; echo "memcheck rc $?"; grep -E "ERROR SUMMARY|PASSED|FAILED" $OUT/memcheck.log | head -3
timeout 100 compute-sanitizer --tool racecheck ./gpu_backend_test --gtest_filter="$F" > $OUT/racecheck.log 2>&1; echo "racecheck rc $?"; grep -E "RACECHECK SUMMARY|PASSED|FAILED" $OUT/racecheck.log | head -3
S="fp8 B=1 next_n=1 n=8k,fp8 B=64 next_n=1 n=8k,fp8 B=1 next_n=1 n=32k,fp8 B=64 next_n=1 n=32k,fp8 B=128 next_n=1 n=32k,fp8 B=1 next_n=1 n=128k,fp8 B=8 next_n=1 n=128k,fp8 B=128 next_n=1 n=128k"
run() {
  local label=$1 bin=$2
  echo "== $label" >> $OUT/bench.log
  timeout 100 ./$bin --no-ceilings --only "$S" > $OUT/b.tmp 2>&1
  cat $OUT/b.tmp >> $OUT/bench.log
  grep -E "^decode" $OUT/b.tmp | grep -v mma.sync | awk -v l="$label" '{printf "%-5s %-28s logits %s topk %s layer %s\n", l, $2" "$3" "$4" "$5, $8, $15, $18}'
}
run old bench_old; run new indexer_gpu_bench; run old2 bench_old; run new2 indexer_gpu_bench
