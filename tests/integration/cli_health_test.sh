#!/usr/bin/env bash
# indexer-cli health, the images' HEALTHCHECK command: exit 0 and SERVING
# from a serving daemon, non-zero from an unknown health service name and
# from an address nothing listens on (within its --timeout).
# Usage: cli_health_test.sh INDEXERD INDEXER_CLI
set -euo pipefail
indexerd=$1 cli=$2
dir=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && { kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; }; rm -rf "$dir"' EXIT
"$indexerd" --profile demo --device cpu --threads 1 --listen 127.0.0.1:0 \
  --port-file "$dir/port" --log-level warn &
pid=$!
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.05; done
[[ -s $dir/port ]] || { echo "indexerd did not start"; exit 1; }
addr=127.0.0.1:$(cat "$dir/port")
[[ $("$cli" --addr "$addr" health) == SERVING ]]
if "$cli" --addr "$addr" health --service no.such.Service 2> "$dir/err"; then
  echo "FAIL: an unknown service was healthy"; exit 1
fi
grep -q NOT_FOUND "$dir/err" || { cat "$dir/err"; exit 1; }
# The daemon's port, closed: the check must fail, not hang.
kill $pid; wait $pid || true; pid=
start=$SECONDS
if "$cli" --addr "$addr" health --timeout 2 2> "$dir/err"; then
  echo "FAIL: a stopped daemon was healthy"; exit 1
fi
((SECONDS - start < 10)) || { echo "FAIL: health took $((SECONDS - start)) s with --timeout 2"; exit 1; }
echo "cli_health_test: ok"
