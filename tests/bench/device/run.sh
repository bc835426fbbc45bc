#!/usr/bin/env bash
# The one entry point for GPU runs. Runs ON THE DEVICE MACHINE from the
# repository root, after tests/bench/device/pack.sh here packed dev/ (or,
# with --xz, devpack/dev.tar.xz, unpacked here when dev/ is absent):
#
#   tests/bench/device/run.sh [STAGE...]     (default: suite sanitize bench service)
#
# Stages (each writes $OUT/<stage>.log, prints its wall time and a summary):
#   suite     every packed GPU test (dev/gpu-tests.txt: the tests/gpu
#             binaries), the gRPC suites (server_test, serving_test,
#             regions_test) against gpu:0, and the Python client's CUDA IPC
#             test plus the torch front-end checked against the cpu backend
#   sanitize  compute-sanitizer memcheck over the same GPU tests (gtest shards
#             run side by side, SAN_SHARDS) and the gRPC
#             suites on gpu:0
#   bench     indexer_gpu_bench on the SPEC §8 target shapes, with ceilings
#   service   end to end through indexerd: indexer-cli bench per transport
#             (inline, host, device) at B=64 x 32k and B=1 x 128k beside the
#             gRPC echo floors, committed steps at B=64 and B=128 x 32k, and a
#             61-layer DeepSeek-V3.2 step through device regions (B=64 x 32k)
#   dataplane issue 10's table: inline, host, device and ring (host or
#             device tensors) at B=64 x 32k and B=1 x 128k, plain and MPS,
#             beside the gRPC floors; the inline path's lent bytes
#   latency   where a layer's round trip goes, per transport, with the
#             client's --busy-poll-us off and on, with and without MPS, for
#             one-layer and eight-layer steps (the same-host split: step
#             start, way in, server, backend enqueue / wait, way out)
#   layers61  the 61-layer DeepSeek-V3.2 step (device regions, B=64 x 32k)
#             as service runs it, then again under MPS with the client
#             busy-polling
#   ab        two daemons of one pack A/B in the same call (AB_BASE: the
#             other indexerd binary): ring (device tensors) and device
#             regions at both shapes under MPS, alternated twice
#   kab       two kernel benches of one pack A/B in the same call (KAB_BASE:
#             the other indexer_gpu_bench binary; KAB_ONLY: its --only
#             shapes), alternated KAB_ROUNDS times (default 2), then the
#             side-by-side tables (bench_table.py)
#   gaps      the decode shapes (GAPS_ONLY) as measured, with the flush's
#             dirty L2 lines cleaned first (--clean-flush) and without the
#             evict-first hint, alternated GAPS_ROUNDS times; the tables;
#             then the bench's --stream-floor on the same shapes (a pure
#             streaming kernel's time under both flushes: gaps-floor.md)
#   table     the full kernel bench TABLE_ROUNDS times (default 3), beside
#             the pack's base bench where pack.sh had BASE_BENCH (the two
#             alternated), then the side-by-side tables and the fits
#             (bench_fit.py: each family's fixed cost a launch and marginal
#             rate over the contexts): a session's table of record, and a
#             change's A/B over every shape
#   sass      cuobjdump of the pack's bench (and the base's): the kernels
#             SASS_MATCH names (default the FP8 prefill configuration), their
#             instructions by opcode, whole and in the tile loop
#             (sass_summary.py), the base's counts beside
#   knob      a knob A/B in one pack (KNOB: variants separated by ';', each
#             "NAME=value ..." settings of kernels/gpu/knobs.h; KNOB_ONLY:
#             the shapes, default KAB_ONLY's), alternated KNOB_ROUNDS times
#             (default 2), then the tables; KNOB_TESTS ("binary:filter")
#             checked under each variant first, KNOB_SANITIZE=1 with
#             memcheck and racecheck
#   kcheck    a kernel change's checks: gpu_backend_test in KCHECK_SHARDS
#             (default 4) gtest shards side by side, then memcheck and
#             racecheck over the tests KCHECK_FILTER names (a gtest filter;
#             default the gather, route, top-k, MXFP4 and small FP8 cases);
#             KCHECK_SHARDS=0 runs only the filter's tests (plainly, then
#             under the sanitizers)
#   trace     where the decode shapes' logits time goes (TRACE_ONLY; the
#             bench's --trace: per-block records of wgmma_ws, wgmma_mxfp4
#             and block_stream, tests/bench/trace_stats.h): the launch
#             outside the blocks, their start and end spreads, a block's
#             fill, stream and drain, the math side's and the copy warp's
#             waits; TRACE_ROUNDS runs (default 2), trace-R.md, each
#             limited to TRACE_TIMEOUT seconds (default 240)
#   ncu       Nsight Compute on one warmed launch per NCU_CASES entry
#             ("kernel regex@bench shape;..."; NCU_BENCH: another bench
#             binary): speed of light, warp states and stall reasons,
#             occupancy, pipes, scheduler ($OUT/ncu-N.txt); NCU_SOURCE=1
#             adds the per-instruction samples ($OUT/ncu-N-src.csv, read
#             with tests/bench/device/ncu_top.py)
#   soak      tests/soak/soak.sh against gpu:0, one run per SOAK_PROFILES
#             entry (default: demo, a small cache, so that the pool fills,
#             and deepseek-v4.1-fp8 and minimax-m3-mxfp4 with SOAK_BIG_MB; empty: none):
#             several clients, committed batches of 10-40 sequences, aborts,
#             bad layers, imports, releases; every reply's rows checked
#             against SPEC §5's shape; drained and memory-bounded at the end
#             (the daemon's live heap and RSS less glibc's kept heap)
#             (SOAK_SECONDS each, default 60); then the long-context mode,
#             one run per SOAK_LONG entry PROFILE:TOKENS[:SEQS] (default
#             deepseek-v4.1-fp8:131072 minimax-m3-mxfp4:131072; empty: none),
#             SOAK_THREADS (4) clients x SEQS (SOAK_LONG_SEQS, 2) imported
#             sequences, cache
#             SOAK_LONG_MB (8192), needles checked in every reply row
#   env       GPU, driver, SOURCE.txt, python/torch (printed first by every run)
# Aliases kept for older notes and results files: gpu-tests and integration
# (parts of suite), memcheck (= sanitize), committed and python (parts of
# service and suite).
#
# Knobs (environment), all optional, none needed for a full run:
#   DEV           the pack folder (default dev/; dev-NAME for a copy from
#                 another worktree)
#   OUT           where logs go (default /tmp/out; the device tool sets it);
#                 at the end every file but the stage logs is packed into
#                 $OUT/out.tgz (the tool returns 8 files; OUT_TAR=0 keeps them)
#   GTEST_FILTER  narrows every gtest binary (googletest reads it itself);
#                 unset = every test
#   STEPS         measured steps per service bench (default 300)
#   TEST_TIMEOUT  seconds before one binary is considered hung (default 600)
#   SAN_SHARDS    gtest shards run at once under compute-sanitizer (default 8)
#   CARD          a substring of the GPU's name (e.g. H200): on any other
#                 card nothing runs and the exit status is 4, so that a call
#                 whose figures only count on that card costs no more than
#                 its start
set -uo pipefail
cd "$(dirname "$0")/../../.."
ROOT=$PWD
DEV=${DEV:-$ROOT/dev}
[[ $DEV == /* ]] || DEV=$ROOT/$DEV
# A compressed pack (pack.sh --xz: the bare pack is over the device tool's
# carry limit) is unpacked here first, and again whenever it differs from
# the one dev/ came from: a warm device machine keeps the git-ignored dev/
# of the call before, and a new pack must not run that one's binaries.
if [[ -f $ROOT/devpack/dev.tar.xz && $DEV == "$ROOT/dev" ]]; then
  sum=$(sha256sum "$ROOT/devpack/dev.tar.xz" | cut -d' ' -f1)
  if [[ ! -d $DEV/bin || $(cat "$DEV/.pack-sha256" 2>/dev/null) != "$sum" ]]; then
    rm -rf "$DEV"
    tar -xJf "$ROOT/devpack/dev.tar.xz" -C "$ROOT" || { echo "run.sh: devpack/dev.tar.xz did not unpack"; exit 2; }
    echo "$sum" > "$DEV/.pack-sha256"
  fi
fi
[[ -d $DEV/bin ]] || { echo "run.sh: no pack at $DEV (run tests/bench/device/pack.sh first)"; exit 2; }
export LD_LIBRARY_PATH=$DEV/lib:${LD_LIBRARY_PATH:-}
export PATH=$DEV/bin:$PATH
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [[ -n ${CARD:-} ]]; then
  card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)
  [[ $card == *"$CARD"* ]] || { echo "run.sh: the GPU is '$card', not $CARD: nothing run"; exit 4; }
fi
CFG=$ROOT/tests/bench/configs/decode-h64-fp8.textproto
STEPS=${STEPS:-300}
TO=${TEST_TIMEOUT:-600}
GRPC_SUITES=(server_test serving_test regions_test inline_path_test ring_test)

daemon_start() {  # daemon_start LOGNAME ARGS... -> $DPID, $DADDR
  local name=$1; shift
  rm -f "/tmp/$name.port"
  # The daemon's log stays in /tmp (a call returns few files); its warnings
  # and errors are appended to the stage's log when it stops.
  DLOG=/tmp/$name-indexerd.log
  indexerd "$@" --listen 127.0.0.1:0 --port-file "/tmp/$name.port" > "$DLOG" 2>&1 &
  DPID=$!
  for _ in $(seq 240); do
    [[ -s /tmp/$name.port ]] && break
    kill -0 "$DPID" 2>/dev/null || { echo "daemon $name: exited at start"; tail -5 "$DLOG"; break; }
    sleep 0.25
  done
  DADDR=127.0.0.1:$(cat "/tmp/$name.port" 2>/dev/null)
  if [[ -s /tmp/$name.port ]]; then
    indexer-cli --addr "$DADDR" health --timeout 120 || echo "daemon $name: not SERVING"
  else
    echo "daemon $name: not SERVING (no port)"
  fi
}
daemon_stop() {
  kill -TERM "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null
  grep -aE "warning|error|critical" "$DLOG" | tail -5
}
link_helpers() {  # the absolute paths tests were built with -> dev/bin
  while read -r p; do
    [[ -n $p && ! -e $p ]] && mkdir -p "$(dirname "$p")" && ln -s "$DEV/bin/$(basename "$p")" "$p"
  done < "$DEV/links.txt"
}
gpu_tests() { cat "$DEV/gpu-tests.txt"; }
bench_filter() { tr '\r' '\n' | grep -vE '^  (import|step|prefill)[: ]|^ *$'; }

# ------------------------------------------------------------------ stages --

stage_env() {
  { cat "$DEV/SOURCE.txt"; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv;
    python3 -c 'import torch, grpc, google.protobuf as p; print("torch", torch.__version__, "gpus", torch.cuda.device_count(), "grpcio", grpc.__version__, "protobuf", p.__version__)'; } 2>&1
}
part_gpu_tests() {
  link_helpers
  for t in $(gpu_tests); do timeout "$TO" "$t" 2>&1; echo "$t rc $?"; done
}
part_integration() {
  link_helpers
  for t in "${GRPC_SUITES[@]}"; do
    INDEXER_TEST_DEVICE=gpu:0 timeout "$TO" "$t" 2>&1; echo "$t (gpu:0) rc $?"
  done
}
part_python() {
  [[ -d $DEV/python ]] || { echo "python: package not packed rc 1"; return; }
  (cd "$ROOT/client/python/tests" && PYTHONPATH=$DEV/python timeout "$TO" python3 -m unittest -v test_cuda_ipc 2>&1 | tail -5)
  daemon_start python-gpu --profile demo --device gpu:0; local gpid=$DPID gaddr=$DADDR glog=$DLOG
  daemon_start python-cpu --profile demo --device cpu
  PYTHONPATH=$DEV/python:$ROOT/client/python timeout "$TO" python3 "$ROOT/client/python/examples/torch_frontend.py" \
    --addr "$gaddr" --cpu-addr "$DADDR" --steps 5 --batch 8 --context 2048 --check 2>&1; echo "torch_frontend rc $?"
  daemon_stop; DPID=$gpid DLOG=$glog; daemon_stop
}
stage_suite() { part_gpu_tests; part_integration; part_python; }

# run_sharded NAME [ENV=VALUE...] -- CMD...: CMD as the caller's $n gtest
# shards at once (each shard's log in /tmp/san-NAME-i.log), a line per shard
# with its rc, the log's tail when it failed.
run_sharded() {
  local name=$1; shift
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  local i rc pids=()
  for ((i = 0; i < n; i++)); do
    env "${envs[@]}" GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i \
      timeout "$TO" "$@" > "/tmp/san-$name-$i.log" 2>&1 &
    pids+=($!)
  done
  for ((i = 0; i < n; i++)); do
    wait "${pids[$i]}"; rc=$?
    # A shard with no test of its own (fewer tests than shards) makes no
    # CUDA call: compute-sanitizer exits 255 on that, not an error.
    if [[ $rc == 255 ]] && grep -q "Running 0 tests" "/tmp/san-$name-$i.log"; then
      echo "$name shard $i/$n: empty (no test in this shard)"; continue
    fi
    echo "$name shard $i/$n: rc $rc; $(grep -E '^\[  (PASSED|FAILED)  \]|ERROR SUMMARY' "/tmp/san-$name-$i.log" | tr '\n' ' ')"
    [[ $rc == 0 ]] || tail -30 "/tmp/san-$name-$i.log"
  done
}

# sanitizers NAME [ENV=VALUE...] -- CMD...: CMD under compute-sanitizer
# memcheck, then racecheck (their logs /tmp/NAME-TOOL.log), a line per tool
# with its rc and summaries, the log's tail when it failed.
sanitizers() {
  local name=$1; shift
  local envs=(); while [[ $1 != -- ]]; do envs+=("$1"); shift; done; shift
  local tool rc worst=0
  for tool in memcheck racecheck; do
    env "${envs[@]}" timeout "$TO" compute-sanitizer --tool "$tool" --error-exitcode 3 "$@" > "/tmp/$name-$tool.log" 2>&1
    rc=$?
    echo "$tool $name rc $rc; $(grep -E '^\[  (PASSED|FAILED)  \]|ERROR SUMMARY|RACECHECK SUMMARY' "/tmp/$name-$tool.log" | tr '\n' ' ')"
    [[ $rc == 0 ]] || { worst=$rc; tail -30 "/tmp/$name-$tool.log"; }
  done
  return $worst
}

stage_sanitize() {
  # Each binary's tests run as SAN_SHARDS gtest shards at once (the host
  # side of memcheck is the slow part; the machine has 16 cores and the GPU
  # room for several contexts), each shard's log kept in /tmp and its tail
  # and error summary printed here.
  link_helpers
  local ms=(compute-sanitizer --tool memcheck --leak-check no --error-exitcode 3)
  local n=${SAN_SHARDS:-8} t
  # device_regions_test opens garbage IPC handles on purpose (the SPEC's bad
  # input): the failing API calls it makes are the test, and it checks each
  # one's status; memory errors are still reported.
  local ms_api=("${ms[@]:0:1}" --report-api-errors no "${ms[@]:1}")
  # SAN_ONLY="a b": only these binaries (GPU tests or gRPC suites).
  only() { [[ -z ${SAN_ONLY:-} || " $SAN_ONLY " == *" $1 "* ]]; }
  for t in $(gpu_tests); do
    only "$t" || continue
    if [[ $t == device_regions_test ]]; then run_sharded "$t" X=1 -- "${ms_api[@]}" "$t"
    else run_sharded "$t" X=1 -- "${ms[@]}" "$t"; fi
  done
  for t in "${GRPC_SUITES[@]}"; do
    only "$t" || continue
    run_sharded "$t-gpu0" INDEXER_TEST_DEVICE=gpu:0 -- "${ms[@]}" "$t"
  done
  tar czf "$OUT/sanitize-logs.tgz" -C /tmp $(cd /tmp && ls san-*.log) 2>/dev/null
}

stage_kcheck() {
  # A kernel change's checks, what each session's device call ran by hand:
  # gpu_backend_test (every GPU path against the cpu backend) as
  # KCHECK_SHARDS gtest shards side by side, then compute-sanitizer
  # memcheck and racecheck over KCHECK_FILTER's tests of it.
  # KCHECK_SHARDS=0: a change to one kernel (e.g. KCHECK_FILTER=
  # 'GpuBlockTest.*' for the block path): only the filter's tests, once
  # plainly, then under the sanitizers.
  local n=${KCHECK_SHARDS:-4}
  local filter=${KCHECK_FILTER:-'Cases/*:Scales/*:Routes/*:Heads/*mxfp4*:Shapes/*fp8_E64_B3_*:Shapes/*mxfp4_E64_B24*'}
  if ((n > 0)); then
    run_sharded gpu_backend_test X=1 -- gpu_backend_test
  else
    timeout "$TO" gpu_backend_test --gtest_filter="$filter" > /tmp/kcheck-plain.log 2>&1
    echo "gpu_backend_test --gtest_filter=$filter rc $?; $(grep -E '^\[  (PASSED|FAILED)  \]' /tmp/kcheck-plain.log | tr '\n' ' ')"
    grep -m5 -E "Failure|FAILED  \] [A-Z]" /tmp/kcheck-plain.log
  fi
  echo "sanitizers on gpu_backend_test --gtest_filter=$filter"
  sanitizers kcheck -- gpu_backend_test --gtest_filter="$filter"
}

stage_bench() {
  # SPEC §8's target shapes.
  # SPEC §8's target shapes and issue 11's: MXFP4 at both sizes, paged
  # prefill, the MiniMax block layer at B=64 x 32k.
  local s="fp8 B=1 next_n=1 n=128k,fp8 B=64 next_n=1 n=32k,fp8 B=64 next_n=2 n=32k,fp8 B=128 next_n=1 n=128k,mxfp4 B=64 next_n=1 n=32k,mxfp4 B=128 next_n=1 n=128k,prefill fp8 4k rows,block mxfp4 Hi=4 top=16 B=64 n=32k"
  timeout "$TO" indexer_gpu_bench --only "$s" --markdown "$OUT/bench.md" 2>&1; echo "indexer_gpu_bench rc $?"
}

part_transports() {
  daemon_start service --config "$CFG" --device gpu:0
  for shape in "64 32768" "1 131072"; do
    set -- $shape
    for tr in inline host device; do
      echo "== B=$1 context=$2 transport=$tr (committed steps)"
      timeout "$TO" indexer-cli --addr "$DADDR" bench --batch "$1" --context "$2" --warmup 5 \
        --steps "$STEPS" --transport "$tr" 2>&1 | bench_filter | tail -14
      echo "bench rc ${PIPESTATUS[0]}"
    done
  done
  daemon_stop
  echo "== echo floor: 200-byte request and reply, TCP and Unix socket"
  timeout "$TO" grpc_echo_bench --warmup 200 --iters 3000 2>&1 | tail -4
  timeout "$TO" grpc_echo_bench --warmup 200 --iters 3000 --unix /tmp/echo.sock 2>&1 | tail -4
}
part_committed() {
  daemon_start committed --config "$CFG" --device gpu:0 --cache-mb 4096
  for b in 64 128; do
    echo "== B=$b x 32k committed"
    timeout "$TO" indexer-cli --addr "$DADDR" bench --batch $b --context 32768 --warmup 3 --steps 100 2>&1 |
      bench_filter | tail -6
    echo "bench rc ${PIPESTATUS[0]}"
  done
  indexer-cli --addr "$DADDR" info | head -12
  kill -0 "$DPID" && echo "daemon alive after committed steps"
  daemon_stop
}
part_layers61() {  # part_layers61 [plain|mps|ring]
  # A DeepSeek-V3.2 decode step: 61 dense layers in sequence, device
  # regions, B=64 x 32k (17 GB of K). With "mps": under MPS, the client
  # busy-polling (the configuration docs/frontend.md recommends). With
  # "ring": under MPS, the step's messages through a request ring (client
  # spin 1000 us), tensors in device regions.
  local mode=${1:-plain} poll=() tr=(--transport device)
  if [[ $mode == mps || $mode == ring ]]; then
    mps_start || { echo "MPS could not start"; return 0; }
    poll=(--busy-poll-us 1000)
  fi
  [[ $mode == ring ]] && tr=(--transport ring --ring-tensors device --ring-spin-us 1000)
  daemon_start layers61-$mode --profile deepseek-v3.2-fp8 --config-dir "$ROOT/deploy/configs" \
    --device gpu:0 --cache-mb 18000
  echo "== 61 layers ($mode)"
  timeout "$TO" indexer-cli --addr "$DADDR" "${poll[@]}" bench --batch 64 --context 32768 --warmup 3 \
    --steps 50 "${tr[@]}" 2>&1 | bench_filter > /tmp/layers61-$mode.txt
  echo "bench rc ${PIPESTATUS[0]}"
  tail -5 /tmp/layers61-$mode.txt
  # Per-layer table: columns 9 and 10 are the logits and top-k p50.
  awk '$2 == "dense" { k += $9 + $10; n++ } END { printf "kernels: %d layers, sum of logits + top-k p50 %.1f us\n", n, k }' /tmp/layers61-$mode.txt
  daemon_stop
  [[ $mode == mps || $mode == ring ]] && mps_stop
  return 0
}
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps /tmp/mps-log
  nvidia-cuda-mps-control -d
}
mps_stop() {
  echo quit | nvidia-cuda-mps-control
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}
stage_service() { part_transports; part_committed; part_layers61; }

bench_line() {  # bench_line LABEL ARGS...: one bench run, its summary lines
  local label=$1; shift
  echo "== $label"
  timeout 150 indexer-cli --addr "$DADDR" "$@" --warmup 5 --steps "${LSTEPS:-150}" 2>&1 | tr '\r' '\n' |
    grep -E "server p50|backend host|step start|adds to its kernels|all timed"
}
stage_latency() {
  # Without MPS: the daemon's and the client's CUDA contexts time-slice.
  # At debug level the daemon logs each step header's parts (parse,
  # admission, rows, the backend's prepare).
  daemon_start latency --config "$CFG" --device gpu:0 --log-level debug
  for poll in 0 1000; do
    bench_line "poll $poll B=64x32k device" --busy-poll-us $poll bench --batch 64 --context 32768 --transport device
    bench_line "poll $poll B=1x128k device" --busy-poll-us $poll bench --batch 1 --context 131072 --transport device
  done
  bench_line "poll 1000 B=64x32k host" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport host
  bench_line "poll 1000 B=1x128k host" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport host
  bench_line "poll 1000 B=64x32k inline" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport inline
  echo "== step headers (daemon log, last B=64 steps)"
  grep -a "begin: 64 sequences" "$DLOG" | tail -3
  daemon_stop
  daemon_start latency8 --config "${CFG%.textproto}-x8.textproto" --device gpu:0
  bench_line "8 layers, poll 1000 B=64x32k device" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport device
  daemon_stop
  echo "== MPS"
  if mps_start; then
    daemon_start latency-mps --config "$CFG" --device gpu:0
    bench_line "MPS poll 1000 B=64x32k device" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport device
    bench_line "MPS poll 1000 B=1x128k device" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport device
    bench_line "MPS poll 1000 B=1x128k host" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport host
    daemon_stop
    daemon_start latency8-mps --config "${CFG%.textproto}-x8.textproto" --device gpu:0
    bench_line "MPS 8 layers, poll 1000 B=64x32k device" --busy-poll-us 1000 bench --batch 64 --context 32768 --transport device
    bench_line "MPS 8 layers, poll 1000 B=1x128k device" --busy-poll-us 1000 bench --batch 1 --context 131072 --transport device
    daemon_stop
    mps_stop
  else
    echo "MPS could not start"
  fi
  echo "== echo floor"
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 2>&1 | tail -3
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 --unix /tmp/echo.sock 2>&1 | tail -1
}

stage_dataplane() {
  # Issue 10's target table in one place: every transport (inline bytes,
  # host regions, device regions, the request ring with host or device
  # tensors) at B=64 x 32k and B=1 x 128k, LSTEPS (default 300) committed
  # steps each, beside the same call's gRPC floors. The daemon logs at
  # debug level, so its per-layer line shows which path the inline bytes
  # took (lent = straight into pinned staging).
  local shape b n
  # DP_LAYERS=8: the 8-layer config, whose later layers do not wait behind
  # the step header (the issue's per-layer figures); DP_MODES: plain, mps.
  LSTEPS=${LSTEPS:-300}
  local cfg=$CFG
  [[ ${DP_LAYERS:-1} == 8 ]] && cfg=${CFG%.textproto}-x8.textproto
  for mode in ${DP_MODES:-plain mps}; do
    if [[ $mode == mps ]]; then mps_start || { echo "MPS could not start"; break; }; fi
    daemon_start dataplane-$mode --config "$cfg" --device gpu:0 --log-level debug
    for shape in "64 32768" "1 131072"; do
      set -- $shape; b=$1; n=$2
      if [[ $mode == plain ]]; then
        bench_line "$mode B=$b n=$n inline poll 1000" --busy-poll-us 1000 bench --batch $b --context $n --transport inline
        echo "== daemon: the last inline layer's bytes"
        grep -a "inline in" "$DLOG" | tail -1
        bench_line "$mode B=$b n=$n host poll 1000" --busy-poll-us 1000 bench --batch $b --context $n --transport host
      fi
      bench_line "$mode B=$b n=$n device poll 1000" --busy-poll-us 1000 bench --batch $b --context $n --transport device
      bench_line "$mode B=$b n=$n ring host spin 0" bench --batch $b --context $n --transport ring --ring-tensors host
      bench_line "$mode B=$b n=$n ring device spin 0" bench --batch $b --context $n --transport ring --ring-tensors device
      bench_line "$mode B=$b n=$n ring device spin 1000" bench --batch $b --context $n --transport ring --ring-tensors device --ring-spin-us 1000
    done
    daemon_stop
    [[ $mode == mps ]] && mps_stop
  done
  echo "== echo floor (200-byte request and reply; TCP, then Unix socket)"
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 2>&1 | tail -3
  timeout 60 grpc_echo_bench --warmup 200 --iters 3000 --unix /tmp/echo.sock 2>&1 | tail -1
}

stage_ab() {
  # Two daemons of one pack, A/B in the same call: $AB_BASE (another
  # indexerd binary, e.g. dev/bin/indexerd-base built from the parent
  # commit) against the packed indexerd, under MPS, 8-layer config, the
  # ring and device-region transports at both shapes (AB_STEPS committed
  # steps each, default 300), twice in alternation so drift shows.
  [[ -x ${AB_BASE:-} ]] || { echo "ab: AB_BASE names no indexerd binary"; return 1; }
  LSTEPS=${AB_STEPS:-300}
  local cfg=${CFG%.textproto}-x8.textproto bin shape b n round
  mps_start || { echo "MPS could not start"; return 1; }
  for round in 1 2; do
    for bin in "$AB_BASE" "$DEV/bin/indexerd"; do
      # daemon_start runs `indexerd` from PATH: a directory holding this one.
      mkdir -p /tmp/ab-bin && ln -sf "$bin" /tmp/ab-bin/indexerd
      PATH=/tmp/ab-bin:$PATH daemon_start ab-$round --config "$cfg" --device gpu:0
      for shape in "64 32768" "1 131072"; do
        set -- $shape; b=$1; n=$2
        bench_line "round $round $(basename "$bin") B=$b n=$n ring device spin 1000" \
          bench --batch $b --context $n --transport ring --ring-tensors device --ring-spin-us 1000
        bench_line "round $round $(basename "$bin") B=$b n=$n device poll 1000" \
          --busy-poll-us 1000 bench --batch $b --context $n --transport device
      done
      daemon_stop
    done
  done
  mps_stop
}

# Aliases (older notes name them).
stage_kab() {
  # Kernel A/B: $KAB_BASE (another indexer_gpu_bench, e.g. built from the
  # parent commit) and this pack's, on the same shapes, alternated.
  [[ -x ${KAB_BASE:-} ]] || { echo "kab: KAB_BASE names no indexer_gpu_bench binary"; return 1; }
  local only=${KAB_ONLY:-decode mxfp4 B=64 next_n=1 n=32k} r rc=0 side bin
  for r in $(seq "${KAB_ROUNDS:-2}"); do
    for side in base new; do
      bin=$DEV/bin/indexer_gpu_bench; [[ $side == base ]] && bin=$KAB_BASE
      echo "== round $r: $side ($bin)"
      timeout "$TO" "$bin" --only "$only" --markdown "$OUT/kab-$r-$side.md" 2>&1 | grep -vE '^ *$'
      [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
    done
  done
  bench_tables "$OUT"/kab-*-base.md "$OUT"/kab-*-new.md
  return $rc
}
stage_table() {
  # The full kernel bench (every shape beside the ceilings) TABLE_ROUNDS
  # times (default 3): table-R-new.md; where the pack holds a base bench
  # (pack.sh with BASE_BENCH: dev/base/, or TABLE_BASE) it runs beside, the
  # two alternated (table-R-base.md); then the side-by-side tables (each
  # round, the medians' difference) and the pack's fits (bench_fit.py). The
  # session's table of record, and the A/B of a change over every shape.
  local base=${TABLE_BASE:-$DEV/base/indexer_gpu_bench} r side bin rc=0 sides=(new) files=()
  [[ -x $base ]] && sides=(base new)
  echo "table: ${sides[*]} x ${TABLE_ROUNDS:-3}"
  for r in $(seq "${TABLE_ROUNDS:-3}"); do
    for side in "${sides[@]}"; do
      bin=$DEV/bin/indexer_gpu_bench; [[ $side == base ]] && bin=$base
      echo "== round $r: $side"
      timeout "$TO" "$bin" --markdown "$OUT/table-$r-$side.md" > "$OUT/table-$r-$side.txt" 2>&1 ||
        { rc=1; echo "table round $r $side rc 1"; tail -3 "$OUT/table-$r-$side.txt"; }
    done
  done
  for side in "${sides[@]}"; do files+=("$OUT"/table-*-"$side".md); done
  bench_tables "${files[@]}"
  # Where the pack's time goes: each family's fixed cost a launch and its
  # marginal rate over the contexts, per batch, then B >= 64 as one.
  echo "== fits (new, per batch)"
  python3 "$ROOT/tests/bench/device/bench_fit.py" "$OUT"/table-*-new.md 2>&1 || echo "bench_fit rc 1"
  echo "== fits (new, B >= 64 merged)"
  python3 "$ROOT/tests/bench/device/bench_fit.py" --min-batch 64 --merge-batches "$OUT"/table-*-new.md 2>&1 ||
    echo "bench_fit rc 1"
  return $rc
}
stage_sass() {
  # The SASS of the kernels whose mangled names match SASS_MATCH (a Python
  # regex; default the FP8 prefill configuration of wgmma_ws), from the
  # pack's bench and, where packed, the base's (dev/base/): per function
  # its instructions and opcodes, whole and in its tile loop, the base's
  # counts beside (sass_summary.py); the matching functions' listings in
  # sass-new.txt and sass-base.txt (the whole listing stays in /tmp).
  local cu match=${SASS_MATCH:-'WsConfigILi64ELi2ELi2ELi2ELi8ELi2ELb0ELb0EEELb0E'} side bin files=()
  cu=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  [[ -x $cu ]] || { echo "sass: no cuobjdump rc 1"; return 1; }
  for side in new base; do
    bin=$DEV/bin/indexer_gpu_bench; [[ $side == base ]] && bin=$DEV/base/indexer_gpu_bench
    [[ -x $bin ]] || continue
    "$cu" -sass "$bin" > "/tmp/sass-$side.txt" 2>&1 || echo "sass: cuobjdump of $bin rc 1"
    awk -v m="$match" '/Function : /{on = ($0 ~ m)} on' "/tmp/sass-$side.txt" > "$OUT/sass-$side.txt"
    files+=("/tmp/sass-$side.txt")
  done
  python3 "$ROOT/tests/bench/device/sass_summary.py" --match "$match" "${files[@]}" 2>&1 || echo "sass_summary rc 1"
}
stage_knob() {
  # A knob A/B in one pack: the bench under each variant of $KNOB (variants
  # separated by ';', each "NAME=value ..." of knobs.h) against none, on
  # KNOB_ONLY's shapes (default KAB_ONLY's), alternated KNOB_ROUNDS times
  # (default 2); knob-R-off.md and knob-R-LABEL.md (LABEL: the variant's
  # settings less INDEXER_GPU_, spaces as '+'), then the side-by-side
  # tables. KNOB_TESTS ("binary:gtest-filter", e.g.
  # "gpu_backend_test:GpuBlockTest.*") runs first under each variant and with
  # none, so that a variant's figures count only where its results match
  # the cpu backend; KNOB_SANITIZE=1 adds memcheck and racecheck of those
  # tests under each variant.
  [[ -n ${KNOB:-} ]] || { echo "knob: KNOB names no setting"; return 1; }
  local only=${KNOB_ONLY:-${KAB_ONLY:-decode fp8 B=64 next_n=1 n=32k}} r rc=0 v i label envs=()
  local bin=$DEV/bin/indexer_gpu_bench variants=("") labels=(off) files=()
  local more=(); IFS=";" read -ra more <<< "$KNOB"
  for v in "${more[@]}"; do
    v=$(echo "$v" | xargs); [[ -n $v ]] || continue
    label=${v//INDEXER_GPU_/}; label=${label// /+}
    variants+=("$v"); labels+=("$label")
  done
  echo "knob: ${variants[*]:1} (labels ${labels[*]})"
  if [[ -n ${KNOB_TESTS:-} ]]; then
    local tbin=${KNOB_TESTS%%:*} tfilter=${KNOB_TESTS#*:} trc
    command -v "$tbin" >/dev/null ||
      { echo "knob: KNOB_TESTS names '$tbin', not a packed binary (dev/gpu-tests.txt lists them)"; return 1; }
    for i in "${!variants[@]}"; do
      read -ra envs <<< "${variants[$i]}"
      env "${envs[@]}" timeout "$TO" "$tbin" --gtest_filter="$tfilter" > "/tmp/knob-test-${labels[$i]}.log" 2>&1
      trc=$?; ((trc == 0)) || rc=1
      echo "tests ${labels[$i]}: $tbin rc $trc; $(grep -E '^\[  (PASSED|FAILED)  \]' "/tmp/knob-test-${labels[$i]}.log" | tr '\n' ' ')"
      grep -m5 -E "Failure|FAILED  \] [A-Z]" "/tmp/knob-test-${labels[$i]}.log"
      [[ -n ${KNOB_SANITIZE:-} && $i -gt 0 ]] || continue
      sanitizers "knob-${labels[$i]}" "${envs[@]}" -- "$tbin" --gtest_filter="$tfilter" || rc=1
    done
  fi
  for r in $(seq "${KNOB_ROUNDS:-2}"); do
    for i in "${!variants[@]}"; do
      echo "== round $r: ${labels[$i]}"
      read -ra envs <<< "${variants[$i]}"
      env "${envs[@]}" timeout "$TO" "$bin" --no-ceilings --only "$only" --markdown "$OUT/knob-$r-${labels[$i]}.md" \
        > "$OUT/knob-$r-${labels[$i]}.txt" 2>&1 || { rc=1; tail -3 "$OUT/knob-$r-${labels[$i]}.txt"; }
    done
  done
  # Tables: the runs without a knob first (the deltas are against them).
  for label in "${labels[@]}"; do files+=("$OUT"/knob-*-"$label".md); done
  bench_tables "${files[@]}"
  return $rc
}
# The median-by-label tables of a stage's bench files (bench_table.py).
bench_tables() {
  local m
  for m in logits topk layer split; do
    echo "== $m"
    python3 "$ROOT/tests/bench/device/bench_table.py" --metric "$m" "$@" 2>&1 || echo "bench_table rc 1"
  done
}
stage_gaps() {
  # Where the decode layers' time over their floors goes: each shape as
  # the bench measures it (default: the flush's 1 GiB leaves the L2 full of
  # dirty lines, as a serving engine's earlier kernels would), with the
  # flush's dirty lines cleaned before the timed kernels (--clean-flush),
  # and without the L2 evict-first hint on K (INDEXER_GPU_WS_EVICT_FIRST=0),
  # alternated GAPS_ROUNDS times (default 2); tables of the three.
  local only=${GAPS_ONLY:-decode fp8 B=64 next_n=1 n=8k,decode fp8 B=8 next_n=1 n=32k,decode fp8 B=64 next_n=1 n=32k,decode fp8 B=128 next_n=1 n=32k,decode fp8 B=64 next_n=1 n=128k,decode fp8 B=128 next_n=1 n=128k,minimax block mxfp4 Hi=4 top=16 B=64 n=32k}
  local r rc=0 bin=$DEV/bin/indexer_gpu_bench ceil=()
  for r in $(seq "${GAPS_ROUNDS:-2}"); do
    # Ceilings once (the first run), for the GB/s column's percentages.
    ((r > 1)) && ceil=(--no-ceilings)
    # Each run's own output (the ceilings, any error) in gaps-R-SIDE.txt.
    echo "== round $r: default"
    timeout "$TO" "$bin" "${ceil[@]}" --only "$only" --markdown "$OUT/gaps-$r-default.md" \
      > "$OUT/gaps-$r-default.txt" 2>&1 || { rc=1; tail -3 "$OUT/gaps-$r-default.txt"; }
    echo "== round $r: clean"
    timeout "$TO" "$bin" --no-ceilings --clean-flush --only "$only" --markdown "$OUT/gaps-$r-clean.md" \
      > "$OUT/gaps-$r-clean.txt" 2>&1 || { rc=1; tail -3 "$OUT/gaps-$r-clean.txt"; }
    echo "== round $r: noevict"
    INDEXER_GPU_WS_EVICT_FIRST=0 timeout "$TO" "$bin" --no-ceilings --only "$only" \
      --markdown "$OUT/gaps-$r-noevict.md" > "$OUT/gaps-$r-noevict.txt" 2>&1 ||
      { rc=1; tail -3 "$OUT/gaps-$r-noevict.txt"; }
  done
  bench_tables "$OUT"/gaps-*-default.md "$OUT"/gaps-*-clean.md "$OUT"/gaps-*-noevict.md
  # The floor under the same flushes: a pure streaming kernel over each
  # shape's K and logits bytes (gaps-floor.md).
  echo "== stream floor"
  timeout "$TO" "$bin" --no-ceilings --stream-floor --only "$only" --markdown "$OUT/gaps-floor.md" \
    > "$OUT/gaps-floor.txt" 2>&1 || { rc=1; tail -3 "$OUT/gaps-floor.txt"; }
  cat "$OUT/gaps-floor.md" 2>/dev/null
  echo "gaps rc $rc"
  return $rc
}
stage_trace() {
  local only=${TRACE_ONLY:-decode fp8 B=64 next_n=1 n=8k,decode fp8 B=1 next_n=1 n=128k,decode fp8 B=64 next_n=1 n=32k,decode fp8 B=64 next_n=2 n=32k,decode fp8 B=128 next_n=1 n=32k,decode fp8 B=128 next_n=1 n=128k,decode mxfp4 B=64 next_n=1 n=32k,minimax block mxfp4 Hi=4 top=16 B=1 n=32k,minimax block mxfp4 Hi=4 top=16 B=64 n=32k,minimax block mxfp4 Hi=4 top=16 B=128 n=32k,v4.1 consumer fp8 H=32 r=4 top=512 B=64 n=128k pool=2048x8}
  local r rc=0 ceil=()
  for r in $(seq "${TRACE_ROUNDS:-2}"); do
    ((r > 1)) && ceil=(--no-ceilings)
    echo "== round $r"
    # Its own limit (TRACE_TIMEOUT, default 240 s), not TEST_TIMEOUT: the
    # first traced run hung (a wait in one lane's branch, fixed since) and
    # took a whole device call.
    timeout "${TRACE_TIMEOUT:-240}" "$DEV/bin/indexer_gpu_bench" "${ceil[@]}" --trace --only "$only" --markdown "$OUT/trace-$r.md" \
      > "$OUT/trace-$r.txt" 2>&1 || { rc=1; echo "trace round $r rc 1"; tail -3 "$OUT/trace-$r.txt"; }
    sed -n '/^Where the logits time goes/,$p' "$OUT/trace-$r.md" 2>/dev/null
  done
  return $rc
}
stage_ncu() {
  # One warmed launch (the 3rd) of each kernel, after the bench's ceilings
  # are skipped; --clock-control none: the clocks the timed runs see.
  # A case may end in @SETTINGS ("NAME=value ...", knobs.h): its runs
  # take them, e.g. two cases of one kernel under two launch shapes.
  local cases=${NCU_CASES:-"DenseLogitsWgmmaMxfp4Kernel@decode mxfp4 B=64 next_n=1 n=32k"} i=0 c k shape set
  command -v ncu >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  IFS=';' read -ra list <<< "$cases"
  for c in "${list[@]}"; do
    k=${c%%@*}; shape=${c#*@}; set=""; i=$((i + 1))
    [[ $shape == *@* ]] && { set=${shape#*@}; shape=${shape%%@*}; }
    local envs=(); read -ra envs <<< "$set"
    echo "== ncu $i: kernel /$k/ in '$shape'${set:+ with $set}"
    # The stall reasons: cycles a warp spends in each per issued instruction.
    env "${envs[@]}" timeout "$TO" ncu --clock-control none --kernel-name-base "${NCU_NAME_BASE:-function}" -k "regex:$k" --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
      --section ComputeWorkloadAnalysis --section SchedulerStats --section MemoryWorkloadAnalysis \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      "${NCU_BENCH:-indexer_gpu_bench}" --only "$shape" --iters 3 --no-ceilings > "$OUT/ncu-$i.txt" 2>&1
    echo "ncu rc $?"
    if [[ -n ${NCU_SOURCE:-} ]]; then
      # Per-instruction warp-state samples (SASS), for tests/bench/device/ncu_top.py.
      env "${envs[@]}" timeout "$TO" ncu --clock-control none --kernel-name-base "${NCU_NAME_BASE:-function}" -k "regex:$k" --launch-skip 2 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        "${NCU_BENCH:-indexer_gpu_bench}" --only "$shape" --iters 3 --no-ceilings > "$OUT/ncu-$i-src.csv" 2>&1
      echo "ncu source rc $?"
    fi
    grep -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|Block Limit (Reg|Sh)|Warp Cycles Per Issued|No Eligible|Active Warps Per" "$OUT/ncu-$i.txt" | head -14
    # Stall reasons above 0.2 cycles per issued instruction, largest first.
    grep -E "issue_stalled_.*per_issue_active" "$OUT/ncu-$i.txt" |
      awk '$NF + 0 >= 0.2 { sub(/smsp__average_warps_issue_stalled_/, "", $1); sub(/_per_issue_active.ratio/, "", $1); print $NF, $1 }' |
      sort -rn | head -8 | tr '\n' ';'; echo
  done
}
stage_soak() {
  local prof mb
  for prof in ${SOAK_PROFILES-demo deepseek-v4.1-fp8 minimax-m3-mxfp4}; do
    mb=8; [[ $prof == demo ]] || mb=${SOAK_BIG_MB:-4096}
    echo "== soak: $prof on gpu:0, cache $mb MB, ${SOAK_SECONDS:-60} s"
    INDEXERD=$DEV/bin/indexerd SOAK_DRIVER=$DEV/bin/soak_driver SOAK_DEVICE=gpu:0 SOAK_PROFILE=$prof \
      SOAK_CACHE_MB=$mb INDEXERD_CONFIG_DIR=$ROOT/deploy/configs \
      timeout "$TO" "$ROOT/tests/soak/soak.sh" "$DEV" "${SOAK_SECONDS:-60}" 2>&1
    echo "soak $prof (gpu:0) rc $?"
  done
  # Long contexts with several clients: imported sequences, needles checked.
  local spec tokens seqs
  for spec in ${SOAK_LONG-deepseek-v4.1-fp8:131072 minimax-m3-mxfp4:131072}; do
    IFS=: read -r prof tokens seqs <<< "$spec"
    seqs=${seqs:-${SOAK_LONG_SEQS:-2}} mb=${SOAK_LONG_MB:-8192}
    echo "== soak: $prof on gpu:0, long contexts: ${SOAK_THREADS:-4} clients x $seqs x $tokens tokens, cache $mb MB, ${SOAK_SECONDS:-60} s"
    INDEXERD=$DEV/bin/indexerd SOAK_DRIVER=$DEV/bin/soak_driver SOAK_DEVICE=gpu:0 SOAK_PROFILE=$prof \
      SOAK_CACHE_MB=$mb SOAK_LONG_TOKENS=$tokens SOAK_LONG_SEQS=$seqs \
      INDEXERD_CONFIG_DIR=$ROOT/deploy/configs \
      timeout "$TO" "$ROOT/tests/soak/soak.sh" "$DEV" "${SOAK_SECONDS:-60}" 2>&1
    echo "soak $prof long (gpu:0) rc $?"
  done
}
stage_gpu_tests() { part_gpu_tests; }
stage_integration() { part_integration; }
stage_python() { part_python; }
stage_memcheck() { stage_sanitize; }
stage_committed() { part_committed; }
stage_layers61() { local m; for m in ${L61_MODES:-plain mps ring}; do part_layers61 "$m"; done; }

stages=("$@")
((${#stages[@]})) || stages=(suite sanitize bench service)
for s in "${stages[@]}"; do
  declare -F "stage_${s//-/_}" > /dev/null ||
    { echo "run.sh: unknown stage '$s' (expected one of: $(declare -F | sed -n 's/^declare -f stage_//p' | tr '\n' ' '))"; exit 2; }
done
[[ " ${stages[*]} " == *" env "* ]] || stages=(env "${stages[@]}")
failed=0
# A stage fails when its log has an "rc N" (N > 0) or "not SERVING" line;
# the A/B stages also return their status (a bench that failed, KNOB
# unset), which counts too (the others end in commands whose status means
# nothing).
status_stages=" kab knob gaps table trace "
for s in "${stages[@]}"; do
  t0=$(date +%s)
  "stage_${s//-/_}" > "$OUT/$s.log" 2>&1
  src=$?
  echo "### $s ($(( $(date +%s) - t0 )) s)"
  grep -aE "PASSED|FAILED|ERROR SUMMARY|rc [0-9]|^soak: [0-9]|^== |rtt p50|backend host|step start|adds to its kernels|verdict|agree|torch|H200|round trip|alive|not SERVING|^knob: |^kab: |^table: | instructions" \
    "$OUT/$s.log" | tail -40
  if grep -aqE "rc [1-9]|not SERVING" "$OUT/$s.log" || [[ $src != 0 && $status_stages == *" $s "* ]]; then
    failed=1; echo "### $s: FAILED"
  fi
done
# The device tool brings back at most 8 files, named in letters, digits,
# '.', '_' and '-': the stage logs stay as they are and everything else
# (bench markdown with '=' in its labels, ncu reports, ...) goes into
# $OUT/out.tgz. OUT_TAR=0 leaves the files.
if [[ ${OUT_TAR:-1} != 0 ]]; then
  # An earlier run's out.tgz in the same $OUT is merged (this run's files win).
  [[ -f $OUT/out.tgz ]] && tar xzf "$OUT/out.tgz" --skip-old-files -C "$OUT" && rm "$OUT/out.tgz"
  mapfile -t loose < <(cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name '*.log' -printf '%P\n')
  if ((${#loose[@]})); then
    (cd "$OUT" && tar czf out.tgz "${loose[@]}" && rm -rf "${loose[@]}") || echo "run.sh: could not pack $OUT into out.tgz"
  fi
fi
exit "$failed"
