#!/usr/bin/env bash
# indexer-cli bench with committed steps (the mode serving engines use)
# against indexerd on the cpu backend: the batches that crashed the commit
# (16 x 2048, 64 x 512) and a step of every layer of the demo profile.
# Usage: cli_bench_test.sh INDEXERD INDEXER_CLI
set -euo pipefail
indexerd=$1 cli=$2
dir=$(mktemp -d)
"$indexerd" --profile demo --device cpu --threads 2 --listen 127.0.0.1:0 \
  --port-file "$dir/port" --log-level warn &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.05; done
[[ -s $dir/port ]] || { echo "indexerd did not start"; exit 1; }
addr=127.0.0.1:$(cat "$dir/port")
"$cli" --addr "$addr" bench --batch 16 --context 2048 --steps 2
"$cli" --addr "$addr" bench --batch 64 --context 512 --steps 2
# The daemon is still serving and holds the sequences the benches created.
"$cli" --addr "$addr" info | tee "$dir/info"
kill -0 $pid
