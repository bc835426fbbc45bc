#!/bin/bash
# Final call on the last commit: integration on gpu:0, memcheck on the tests
# the previous call's filter left out, racecheck on the top-k routes it did
# not reach, then the whole benchmark table.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/../dev-lib:$LD_LIBRARY_PATH
cat SOURCE.txt | tee $OUT/source.txt
CLI_PATH=$(grep -aom1 '/[[:alnum:]_./+-]*/client/indexer-cli' ./server_test | head -1)
[[ -n $CLI_PATH && ! -e $CLI_PATH ]] && mkdir -p "$(dirname "$CLI_PATH")" && ln -s "$PWD/indexer-cli" "$CLI_PATH"
INDEXER_TEST_DEVICE=gpu:0 timeout 60 ./server_test > $OUT/server_test_gpu.log 2>&1; echo "server_test (gpu:0) rc $?"
grep -E "backend \]|^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/server_test_gpu.log | tail -4
timeout 60 compute-sanitizer --tool memcheck --leak-check no ./gpu_backend_test --gtest_filter='-*Topk*' > $OUT/memcheck_rest.log 2>&1; echo "memcheck rc $?"
grep -E "ERROR SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/memcheck_rest.log | tail -3
timeout 60 compute-sanitizer --tool racecheck ./gpu_backend_test --gtest_filter='*Stressed*mixed_B64*:*Stressed*crowded_B3_n70000*:*GpuCandidateTest*c0' > $OUT/racecheck.log 2>&1; echo "racecheck rc $?"
grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/racecheck.log | tail -3
timeout 250 ./indexer_gpu_bench --markdown $OUT/bench.md > $OUT/bench.log 2>&1; echo "bench rc $?"
grep -E "ceilings" $OUT/bench.log; grep -cE "^decode|^prefill" $OUT/bench.log
