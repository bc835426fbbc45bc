#!/bin/bash
# Final device call A: the whole GPU suite, memcheck on the whole suite,
# racecheck on the fast paths, the whole integration suite on gpu:0.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=${LIBS:-$PWD/../dev-lib}:$LD_LIBRARY_PATH
cat SOURCE.txt | tee $OUT/source.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
timeout 200 ./gpu_backend_test > $OUT/gpu_test.log 2>&1; echo "gpu_backend_test rc $?"
grep -E "^\[==========\]|^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED" $OUT/gpu_test.log | tail -8
grep -E "path \]" $OUT/gpu_test.log | sort | uniq -c
CLI_PATH=$(grep -aom1 '/[[:alnum:]_./+-]*/client/indexer-cli' ./server_test | head -1)
[[ -n $CLI_PATH && ! -e $CLI_PATH ]] && mkdir -p "$(dirname "$CLI_PATH")" && ln -s "$PWD/indexer-cli" "$CLI_PATH"
INDEXER_TEST_DEVICE=gpu:0 timeout 200 ./server_test > $OUT/server_test_gpu.log 2>&1; echo "server_test (gpu:0) rc $?"
grep -E "backend \]|^\[==========\]|^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED" $OUT/server_test_gpu.log | tail -8
timeout ${SAN_S:-200} compute-sanitizer --tool memcheck --leak-check no ./gpu_backend_test > $OUT/memcheck.log 2>&1; echo "memcheck rc $?"
grep -E "ERROR SUMMARY|^\[==========\]|^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/memcheck.log | tail -5
timeout ${RACE_S:-120} compute-sanitizer --tool racecheck ./gpu_backend_test --gtest_filter="${RACE_FILTER}" > $OUT/racecheck.log 2>&1; echo "racecheck rc $?"
grep -E "RACECHECK SUMMARY|^\[==========\]|^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/racecheck.log | tail -5
