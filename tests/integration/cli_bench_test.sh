#!/usr/bin/env bash
# indexer-cli bench with committed steps (the mode serving engines use)
# against indexerd on the cpu backend: the batches that crashed the commit
# (16 x 2048, 64 x 512), a step of every layer of the demo profile, and the
# same with --transport host, by shared-memory name and by memfd, and
# with --transport ring.
# Usage: cli_bench_test.sh INDEXERD INDEXER_CLI
set -euo pipefail
indexerd=$1 cli=$2
dir=$(mktemp -d)
"$indexerd" --profile demo --device cpu --threads 2 --listen 127.0.0.1:0 \
  --port-file "$dir/port" --log-level warn --drain-delay-ms 0 \
  --memfd-socket "$dir/memfd.sock" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.05; done
[[ -s $dir/port ]] || { echo "indexerd did not start"; exit 1; }
addr=127.0.0.1:$(cat "$dir/port")
"$cli" --addr "$addr" bench --batch 16 --context 2048 --steps 2
"$cli" --addr "$addr" bench --batch 64 --context 512 --steps 2
# Tensors by reference to a host region, the top-k through topk_out; the
# region is unregistered at the end of the run.
"$cli" --addr "$addr" --client-id cli-bench-host bench --transport host --batch 16 \
  --context 1024 --steps 2 | tee "$dir/host"
grep -q '^transport: host' "$dir/host"
grep -q 'all timed layers: rtt p50' "$dir/host"
# The same with a memfd passed over the daemon's memfd socket.
"$cli" --addr "$addr" --client-id cli-bench-memfd bench --transport host --host-region memfd \
  --batch 16 --context 1024 --steps 2 | tee "$dir/memfd"
grep -q '^transport: host (memfd)' "$dir/memfd"
grep -q 'all timed layers: rtt p50' "$dir/memfd"
# The step's messages through a request ring (no gRPC in the loop); the
# ring is detached and its region unregistered at the end of the run.
"$cli" --addr "$addr" --client-id cli-bench-ring bench --transport ring --batch 16 \
  --context 1024 --steps 2 | tee "$dir/ring"
grep -q '^transport: ring' "$dir/ring"
grep -q 'all timed layers: rtt p50' "$dir/ring"
# A context beyond one import (max_q_len 65536 tokens): the bench splits it.
"$cli" --addr "$addr" bench --batch 1 --context 131072 --steps 1
# The daemon is still serving and holds the sequences the benches created.
"$cli" --addr "$addr" info | tee "$dir/info"
kill -0 $pid
