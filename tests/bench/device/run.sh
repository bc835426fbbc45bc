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
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
DEV=$ROOT/dev
export LD_LIBRARY_PATH=$DEV/lib:${LD_LIBRARY_PATH:-}
export PATH=$DEV/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CFG=$ROOT/tests/bench/configs/decode-h64-fp8.textproto
STEPS=${STEPS:-300}

summary() { grep -aE "$2" "$OUT/$1.log" | tail -"${3:-8}"; }

daemon_start() {  # daemon_start LOGNAME ARGS... -> $DPID, $DADDR
  rm -f /tmp/indexerd.port
  indexerd "$@" --listen 127.0.0.1:0 --port-file /tmp/indexerd.port > "$OUT/$LOG_PREFIX-indexerd.log" 2>&1 &
  DPID=$!
  for _ in $(seq 240); do [[ -s /tmp/indexerd.port ]] && break; sleep 0.25; done
  DADDR=127.0.0.1:$(cat /tmp/indexerd.port 2>/dev/null)
}
daemon_stop() { kill -TERM "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; }

stage_env() {
  { cat "$DEV/SOURCE.txt"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv;
    python3 -c 'import torch, grpc, google.protobuf as p; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "grpcio", grpc.__version__, "protobuf", p.__version__)'; } 2>&1
}
stage_gpu_tests() { timeout 240 gpu_backend_test 2>&1; echo "rc $?"; }
stage_integration() {
  local cli; cli=$(cat "$DEV/cli_path.txt" 2>/dev/null)
  [[ -n $cli && ! -e $cli ]] && mkdir -p "$(dirname "$cli")" && ln -s "$DEV/bin/indexer-cli" "$cli"
  for t in server_test serving_test regions_test; do
    command -v $t >/dev/null || { echo "$t: not packed"; continue; }
    INDEXER_TEST_DEVICE=gpu:0 timeout 200 $t 2>&1; echo "$t rc $?"
  done
}
stage_memcheck() {
  timeout 300 compute-sanitizer --tool memcheck --leak-check no gpu_backend_test 2>&1 | tail -30; echo "rc $?"
  command -v regions_test >/dev/null &&
    { INDEXER_TEST_DEVICE=gpu:0 timeout 200 compute-sanitizer --tool memcheck --leak-check no regions_test 2>&1 | tail -30; echo "regions rc $?"; }
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
      timeout 150 indexer-cli --addr "$DADDR" bench --batch "$1" --context "$2" --warmup 5 \
        --steps "$STEPS" --transport "$tr" 2>&1 | tr '\r' '\n' | grep -vE '^  (import|step|prefill)[: ]|^ *$' | tail -8
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
stage_python() {
  [[ -d $DEV/python ]] || { echo "python package not packed"; return; }
  LOG_PREFIX=python-gpu daemon_start --profile demo --device gpu:0; local gpu=$DADDR gpid=$DPID
  LOG_PREFIX=python-cpu daemon_start --profile demo --device cpu; local cpu=$DADDR
  PYTHONPATH=$DEV/python:$ROOT/client/python timeout 200 python3 "$ROOT/client/python/examples/torch_frontend.py" \
    --addr "$gpu" --cpu-addr "$cpu" --steps 5 --batch 8 --context 2048 --check 2>&1; echo "rc $?"
  daemon_stop; DPID=$gpid; daemon_stop
}

stages=("$@")
((${#stages[@]})) || stages=(env gpu-tests integration memcheck bench service committed python)
for s in "${stages[@]}"; do
  t0=$(date +%s)
  "stage_${s//-/_}" > "$OUT/$s.log" 2>&1
  echo "### $s ($(( $(date +%s) - t0 )) s)"
  grep -aE "PASSED|FAILED|ERROR SUMMARY|rc [0-9]|^== |rtt p50|adds to its kernels|verdict|agree|torch|H200|round trip|alive" "$OUT/$s.log" | tail -40
done
