#!/bin/bash
# Service latency over TCP loopback and over a Unix socket, alternated.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=${LIBS:-$PWD/../dev-lib}:$LD_LIBRARY_PATH
ROOT=${ROOT:-$(cd .. && pwd)}
for round in 1 2; do
for addr in 127.0.0.1:50061 unix:/tmp/indexerd.sock; do
  rm -f /tmp/indexerd.port /tmp/indexerd.sock
  ./indexerd --config $ROOT/tests/bench/configs/decode-h64-fp8.textproto --device gpu:0 \
    --listen $addr --port-file /tmp/indexerd.port > $OUT/indexerd_$round.log 2>&1 &
  PID=$!
  for i in $(seq 1 120); do [[ -s /tmp/indexerd.port ]] && break; sleep 0.5; done
  echo "== round $round $addr" | tee -a $OUT/service.log
  timeout 120 ./indexer-cli --addr $addr bench --batch 64 --context 32768 --warmup 3 --abort-steps --steps 300 2>&1 \
    | tr '\r' '\n' | grep -E "server p50|all timed|^0 " | tee -a $OUT/service.log
  kill -TERM $PID; wait $PID
done
done
