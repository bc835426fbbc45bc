#!/usr/bin/env bash
# Runs ON THE DEVICE MACHINE from the repository root, after pack.sh here:
#   tests/bench/device/run.sh STAGE...    (default: every stage, in order)
# Each stage writes $OUT/<stage>.log and prints a short summary; the device
# call returns those files. Stages:
#   env         GPU, driver, SOURCE.txt, python/torch
#   gpu-tests   gpu_backend_test (every GPU path against the cpu backend)
#   integration server_test, serving_test, regions_test against gpu:0
#   memcheck    compute-sanitizer memcheck: gpu_backend_test, regions_test on gpu:0
#   bench       indexer_gpu_bench on the SPEC §8 target shapes, with ceilings
#   service     indexer-cli bench per transport (inline, host, device) beside
#               the echo floors: B=64 x 32k and B=1 x 128k, committed steps
#   committed   indexer-cli bench, committed steps, B=64 and B=128 x 32k
#   python      the torch front-end example through device regions, checked
#               against the cpu backend
#   layers61    a 61-layer DeepSeek-V3.2 step through device regions, B=64 x 32k
#   latency     where a layer's round trip goes, per transport, with the
#               client's --busy-poll-us off and on, with and without MPS, for
#               one-layer and eight-layer steps (the same-host split: step
#               start, way in, server, backend enqueue / wait, way out)
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
DEV=${DEV:-$ROOT/dev}  # DEV=dev-NAME runs a pack copied from another worktree
export LD_LIBRARY_PATH=$DEV/lib:${LD_LIBRARY_PATH:-}
export PATH=$DEV/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CFG=$ROOT/tests/bench/configs/decode-h64-fp8.textproto
STEPS=${STEPS:-300}

summary() { grep -aE "$2" "$OUT/$1.log" | tail -"${3:-8}"; }

daemon_start() {  # daemon_start LOGNAME ARGS... -> $DPID, $DADDR
  rm -f /tmp/indexerd.port
  # The daemon's log stays in /tmp (a call returns at most 8 files); its
  # warnings and errors are appended to the stage's log when it stops.
  DLOG=/tmp/$LOG_PREFIX-indexerd.log
  indexerd "$@" --listen 127.0.0.1:0 --port-file /tmp/indexerd.port > "$DLOG" 2>&1 &
  DPID=$!
  for _ in $(seq 240); do [[ -s /tmp/indexerd.port ]] && break; sleep 0.25; done
  DADDR=127.0.0.1:$(cat /tmp/indexerd.port 2>/dev/null)
}
daemon_stop() {
  kill -TERM "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null
  grep -aE "warning|error|critical" "$DLOG" | tail -5
}

stage_env() {
  { cat "$DEV/SOURCE.txt"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv;
    python3 -c 'import torch, grpc, google.protobuf as p; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "grpcio", grpc.__version__, "protobuf", p.__version__)'; } 2>&1
}
link_helpers() {  # the absolute paths tests were built with -> dev/bin
  while read -r p; do
    [[ -n $p && ! -e $p ]] && mkdir -p "$(dirname "$p")" && ln -s "$DEV/bin/$(basename "$p")" "$p"
  done < "$DEV/links.txt"
}
stage_gpu_tests() {
  link_helpers
  for t in gpu_backend_test gpu_device_tensors_test device_regions_test; do
    command -v $t >/dev/null || { echo "$t: not packed"; continue; }
    timeout 240 $t 2>&1; echo "$t rc $?"
  done
}
stage_integration() {
  link_helpers
  for t in server_test serving_test regions_test; do
    command -v $t >/dev/null || { echo "$t: not packed"; continue; }
    INDEXER_TEST_DEVICE=gpu:0 timeout 200 $t 2>&1; echo "$t rc $?"
  done
}
stage_memcheck() {
  # The layer path (RunLayer, device tensors, regions) and a slice of the
  # kernel suite; MEMCHECK_FILTER widens it.
  link_helpers
  local ms="compute-sanitizer --tool memcheck --leak-check no"
  for t in gpu_device_tensors_test device_regions_test; do
    timeout 150 $ms $t 2>&1 | tail -6; echo "$t rc $?"
  done
  for t in regions_test serving_test; do
    INDEXER_TEST_DEVICE=gpu:0 timeout 200 $ms $t 2>&1 | tail -6; echo "$t (gpu:0) rc $?"
  done
  timeout 200 $ms gpu_backend_test --gtest_filter="${MEMCHECK_FILTER:-*E64_B23*:*Candidate*:*Block*}" 2>&1 | tail -6
  echo "gpu_backend_test rc $?"
}
stage_bench() {
  local s="fp8 B=1 next_n=1 n=128k,fp8 B=64 next_n=1 n=32k,fp8 B=64 next_n=2 n=32k,fp8 B=128 next_n=1 n=128k,mxfp4 B=64 next_n=1 n=32k"
  timeout 200 indexer_gpu_bench --only "$s" --markdown "$OUT/bench.md" 2>&1; echo "rc $?"
}
stage_service() {
  LOG_PREFIX=service daemon_start --config "$CFG" --device gpu:0
  for shape in "64 32768" "1 131072"; do
    set -- $shape
    for tr in inline host device; do
      echo "== B=$1 context=$2 transport=$tr (committed steps)"
      timeout 90 indexer-cli --addr "$DADDR" bench --batch "$1" --context "$2" --warmup 5 \
        --steps "$STEPS" --transport "$tr" 2>&1 | tr '\r' '\n' | grep -vE '^  (import|step|prefill)[: ]|^ *$' | tail -14
    done
  done
  daemon_stop
  echo "== echo floor: 200-byte request and reply, TCP and Unix socket"
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 2>&1 | tail -4
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 --unix /tmp/echo.sock 2>&1 | tail -4
}
stage_committed() {
  LOG_PREFIX=committed daemon_start --config "$CFG" --device gpu:0 --cache-mb 4096
  for b in 64 128; do
    echo "== B=$b x 32k committed"
    timeout 200 indexer-cli --addr "$DADDR" bench --batch $b --context 32768 --warmup 3 --steps 100 2>&1 |
      tr '\r' '\n' | grep -vE '^  (import|step|prefill)[: ]|^ *$' | tail -6
    echo "rc ${PIPESTATUS[0]}"
  done
  indexer-cli --addr "$DADDR" info | head -12
  kill -0 "$DPID" && echo "daemon alive after committed steps"
  daemon_stop
}
stage_layers61() {
  # A DeepSeek-V3.2 decode step: 61 dense layers in sequence, device
  # regions, B=64 x 32k (17 GB of K).
  LOG_PREFIX=layers61 daemon_start --profile deepseek-v3.2-fp8 --config-dir "$ROOT/deploy/configs" \
    --device gpu:0 --cache-mb 18000
  timeout 300 indexer-cli --addr "$DADDR" bench --batch 64 --context 32768 --warmup 3 --steps "${STEPS61:-50}" \
    --transport device 2>&1 | tr '\r' '\n' | grep -vE '^  (import|step|prefill)[: ]|^ *$' > /tmp/layers61.txt
  echo "rc ${PIPESTATUS[0]}"
  tail -4 /tmp/layers61.txt
  # Per-layer table: columns 9 and 10 are the logits and top-k p50.
  awk '$2 == "dense" { k += $9 + $10; n++ } END { printf "kernels: %d layers, sum of logits + top-k p50 %.1f us\n", n, k }' /tmp/layers61.txt
  daemon_stop
}
bench_line() {  # bench_line LABEL ARGS...: one bench run, its summary lines
  local label=$1; shift
  echo "== $label"
  timeout 120 indexer-cli --addr "$DADDR" "$@" --warmup 5 --steps "${LSTEPS:-150}" 2>&1 | tr '\r' '\n' |
    grep -E "server p50|backend host|step start|adds to its kernels|all timed"
}
stage_latency() {
  # Without MPS: the daemon's and the client's CUDA contexts time-slice.
  LOG_PREFIX=latency daemon_start --config "$CFG" --device gpu:0
  for poll in 0 1000; do
    bench_line "poll $poll B=64x32k device" --busy-poll-us $poll bench --batch 64 --context 32768 --transport device
    bench_line "poll $poll B=1x128k device" --busy-poll-us $poll bench --batch 1 --context 131072 --transport device
  done
  bench_line "poll 1000 B=64x32k host" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport host
  bench_line "poll 1000 B=1x128k host" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport host
  bench_line "poll 1000 B=64x32k inline" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport inline
  daemon_stop
  LOG_PREFIX=latency8 daemon_start --config "${CFG%.textproto}-x8.textproto" --device gpu:0
  bench_line "8 layers, poll 1000 B=64x32k device" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport device
  daemon_stop
  echo "== MPS"
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log; mkdir -p /tmp/mps /tmp/mps-log
  if nvidia-cuda-mps-control -d; then
    LOG_PREFIX=latency-mps daemon_start --config "$CFG" --device gpu:0
    bench_line "MPS poll 1000 B=64x32k device" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport device
    bench_line "MPS poll 1000 B=1x128k device" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport device
    bench_line "MPS poll 1000 B=1x128k host" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport host
    daemon_stop
    LOG_PREFIX=latency8-mps daemon_start --config "${CFG%.textproto}-x8.textproto" --device gpu:0
    bench_line "MPS 8 layers, poll 1000 B=64x32k device" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport device
    bench_line "MPS 8 layers, poll 1000 B=1x128k device" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport device
    daemon_stop
    echo quit | nvidia-cuda-mps-control
  else
    echo "MPS could not start"
  fi
  echo "== echo floor"
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 2>&1 | tail -3
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 --unix /tmp/echo.sock 2>&1 | tail -1
}
stage_python() {
  [[ -d $DEV/python ]] || { echo "python package not packed"; return; }
  (cd "$ROOT/client/python/tests" && PYTHONPATH=$DEV/python timeout 120 python3 -m unittest -v test_cuda_ipc 2>&1 | tail -5)
  LOG_PREFIX=python-gpu daemon_start --profile demo --device gpu:0; local gpu=$DADDR gpid=$DPID
  LOG_PREFIX=python-cpu daemon_start --profile demo --device cpu; local cpu=$DADDR
  PYTHONPATH=$DEV/python:$ROOT/client/python timeout 200 python3 "$ROOT/client/python/examples/torch_frontend.py" \
    --addr "$gpu" --cpu-addr "$cpu" --steps 5 --batch 8 --context 2048 --check 2>&1; echo "rc $?"
  daemon_stop; DPID=$gpid; daemon_stop
}

stages=("$@")
((${#stages[@]})) || stages=(env gpu-tests integration memcheck bench service committed python layers61)
for s in "${stages[@]}"; do
  t0=$(date +%s)
  "stage_${s//-/_}" > "$OUT/$s.log" 2>&1
  echo "### $s ($(( $(date +%s) - t0 )) s)"
  grep -aE "PASSED|FAILED|ERROR SUMMARY|rc [0-9]|^== |rtt p50|backend host|adds to its kernels|verdict|agree|torch|H200|round trip|alive" "$OUT/$s.log" | tail -40
done
