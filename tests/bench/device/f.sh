#!/bin/bash
# Session 3 final device call: tests, integration on gpu:0, racecheck, the
# target shapes (and MXFP4 old vs new producer), service latency, memcheck
# on the whole GPU suite with the remaining time.
cd "$(dirname "$0")"
T0=$(date +%s)
export LD_LIBRARY_PATH=$PWD/../dev-lib:$LD_LIBRARY_PATH
ROOT=$(cd .. && pwd)
cat SOURCE.txt | tee $OUT/source.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/env.txt
timeout 120 ./gpu_backend_test > $OUT/gpu_test.log 2>&1; echo "gpu_backend_test rc $?"
grep -E "^\[==========\]|^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED" $OUT/gpu_test.log | tail -6
grep -E "path \]" $OUT/gpu_test.log | sort | uniq -c
CLI_PATH=$(grep -aom1 '/[[:alnum:]_./+-]*/client/indexer-cli' ./server_test | head -1)
[[ -n $CLI_PATH && ! -e $CLI_PATH ]] && mkdir -p "$(dirname "$CLI_PATH")" && ln -s "$PWD/indexer-cli" "$CLI_PATH"
INDEXER_TEST_DEVICE=gpu:0 timeout 90 ./server_test > $OUT/server_test_gpu.log 2>&1; echo "server_test (gpu:0) rc $?"
grep -E "backend \]|^\[==========\]|^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED" $OUT/server_test_gpu.log | tail -6
timeout 100 compute-sanitizer --tool racecheck ./gpu_backend_test --gtest_filter='*mxfp4_E64_B16*:*fp8_E64_B1_q40to40_n20000*:*GpuTopkKernelTest*crowded_B1_*:*mxfp4_E64_B23_q1to2_n5000_H64_k512:*E128_B3_q1to2*' > $OUT/racecheck.log 2>&1; echo "racecheck rc $?"
grep -E "RACECHECK SUMMARY|^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/racecheck.log | tail -4
S="fp8 B=1 next_n=1 n=8k,fp8 B=8 next_n=1 n=32k,fp8 B=64 next_n=1 n=32k,fp8 B=64 next_n=2 n=32k,fp8 B=1 next_n=1 n=128k,fp8 B=128 next_n=1 n=128k,mxfp4 B=64 next_n=1 n=32k,mxfp4 B=64 next_n=2 n=32k,prefill fp8 4k"
timeout 150 ./indexer_gpu_bench --only "$S" --markdown $OUT/bench.md > $OUT/bench.log 2>&1; echo "bench rc $?"
grep -E "ceilings" $OUT/bench.log; grep -E "^\| (decode|prefill)" $OUT/bench.md
timeout 40 ./bench_old --only "mxfp4 B=64 next_n=1 n=32k,mxfp4 B=64 next_n=2 n=32k" > $OUT/bench_old.log 2>&1; echo "bench_old rc $?"
grep -E "^decode" $OUT/bench_old.log | sed 's/^/old 68e4734: /'
rm -f /tmp/indexerd.port
./indexerd --config $ROOT/tests/bench/configs/decode-h64-fp8.textproto --device gpu:0 \
  --listen 127.0.0.1:50061 --port-file /tmp/indexerd.port > $OUT/indexerd.log 2>&1 &
PID=$!
for i in $(seq 1 120); do [[ -s /tmp/indexerd.port ]] && break; sleep 0.5; done
for round in 1 2; do
  timeout 60 ./indexer-cli bench --batch 64 --context 32768 --warmup 3 --abort-steps --steps 300 > $OUT/service_$round.log 2>&1
  echo "service round $round rc $?"; tr '\r' '\n' < $OUT/service_$round.log | grep -vE '^  (import|step|prefill)[: ]|^ *$' | tail -6
done
kill -TERM $PID; wait $PID
for args in "" "--unix /tmp/echo.sock" "--default-transport"; do
  echo "== echo $args"; timeout 30 ./grpc_echo_bench --warmup 50 --iters 2000 $args 2>&1 | tail -2
done
LEFT=$(( 575 - ($(date +%s) - T0) ))
echo "memcheck budget ${LEFT}s"
timeout $LEFT compute-sanitizer --tool memcheck --leak-check no ./gpu_backend_test > $OUT/memcheck.log 2>&1; echo "memcheck rc $?"
grep -E "ERROR SUMMARY|^\[==========\]|^\[  (PASSED|FAILED) |^\[  FAILED" $OUT/memcheck.log | tail -5
grep -cE "^\[       OK \]" $OUT/memcheck.log
