#!/bin/bash
# Final device call B: the benchmark table (every SPEC §8 shape, ceilings
# measured), then the per-layer service latency of indexerd on gpu:0 over
# loopback gRPC beside a bare gRPC echo of the same bytes (TCP and a Unix
# socket).
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=${LIBS:-$PWD/../dev-lib}:$LD_LIBRARY_PATH
ROOT=${ROOT:-$(cd .. && pwd)}
cat SOURCE.txt > $OUT/source.txt
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee $OUT/env.txt
timeout ${BENCH_S:-300} ./indexer_gpu_bench --markdown $OUT/bench.md ${BENCH_ARGS} > $OUT/bench.log 2>&1; echo "bench rc $?"
grep -E "ceilings" $OUT/bench.log
cat $OUT/bench.md | tail -45
rm -f /tmp/indexerd.port
./indexerd --config $ROOT/tests/bench/configs/decode-h64-fp8.textproto --device gpu:0 \
  --listen 127.0.0.1:50061 --port-file /tmp/indexerd.port > $OUT/indexerd.log 2>&1 &
PID=$!
for i in $(seq 1 120); do [[ -s /tmp/indexerd.port ]] && break; sleep 0.5; done
./indexer-cli info 2>&1 | head -12 > $OUT/info.txt
B="./indexer-cli bench --batch 64 --context 32768 --warmup 3 --abort-steps"
echo "== $B --steps 300" | tee $OUT/service.log
timeout 120 $B --steps 300 2>&1 | tr '\r' '\n' | grep -vE '^  (import|step|prefill)[: ]|^ *$' | tee -a $OUT/service.log | tail -5
kill -TERM $PID; wait $PID
E="./grpc_echo_bench --warmup 50 --iters 2000"
for args in "" "--unix /tmp/echo.sock"; do
  echo "== $E $args" | tee -a $OUT/service.log
  timeout 30 $E $args 2>&1 | tee -a $OUT/service.log | tail -1
done
