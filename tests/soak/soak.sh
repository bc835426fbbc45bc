#!/usr/bin/env bash
# Soak: starts indexerd (--device cpu unless SOAK_DEVICE names another, the
# demo profile, a small cache so the pool fills now and then) on a free
# loopback port, runs tests/soak's driver against it for SECONDS (default
# 600) and fails on any error (a reply row of the wrong shape included:
# client::CheckReplyShape), on pages,
# sequences or open steps left after everything is released, on daemon
# memory growth past RSS_GROWTH_MB (default 64) after warm-up (its live heap
# and its RSS less the freed heap glibc keeps, read from its metrics
# endpoint: soak_driver.cc says why), or if the daemon dies.
# Usage: tests/soak/soak.sh [BUILD_DIR=build] [SECONDS=600]
# Env: SOAK_THREADS (4), SOAK_CACHE_MB (8), SOAK_PROFILE (demo), SOAK_DEVICE
# (cpu; gpu:0 on the device machine: run.sh's soak stage), RSS_GROWTH_MB;
# SOAK_LONG_TOKENS (0), SOAK_LONG_SEQS (4), SOAK_IMPORT_CHUNK (0): the
# driver's long-context mode (--long-tokens ...: imported sequences of that
# many tokens per thread, needles checked in every reply row);
# SOAK_IMPATIENT (1): more client threads whose calls have deadlines of
# 0.3-100 ms, every timed-out step or import reconciled (--impatient);
# INDEXERD and SOAK_DRIVER: the binaries, when not those of BUILD_DIR (a
# device pack keeps them in dev/bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
secs=${2:-600}
daemon=${INDEXERD:-$build/server/indexerd}
driver=${SOAK_DRIVER:-$build/tests/soak/soak_driver}
for b in "$daemon" "$driver"; do
  [[ -x "$b" ]] || { echo "soak: $b not built (cmake --build $build --target indexerd soak_driver)" >&2; exit 1; }
done
tmp=$(mktemp -d)
pid=
cleanup() {
  if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then kill "$pid"; wait "$pid" || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
"$daemon" --profile "${SOAK_PROFILE:-demo}" --device "${SOAK_DEVICE:-cpu}" --cache-mb "${SOAK_CACHE_MB:-8}" \
  --listen 127.0.0.1:0 --port-file "$tmp/port" --metrics-listen 127.0.0.1:0 \
  --metrics-port-file "$tmp/metrics-port" --log-level warn --drain-delay-ms 0 >"$tmp/daemon.log" 2>&1 &
pid=$!
for _ in $(seq 300); do
  [[ -s "$tmp/port" ]] && break
  kill -0 "$pid" 2>/dev/null || { echo "soak: indexerd exited at start:" >&2; cat "$tmp/daemon.log" >&2; exit 1; }
  sleep 0.1
done
[[ -s "$tmp/port" ]] || { echo "soak: indexerd wrote no port file in 30 s" >&2; exit 1; }
rc=0
"$driver" --addr "127.0.0.1:$(cat "$tmp/port")" --seconds "$secs" --pid "$pid" \
  --metrics-addr "127.0.0.1:$(cat "$tmp/metrics-port")" \
  --threads "${SOAK_THREADS:-4}" --rss-growth-mb "${RSS_GROWTH_MB:-64}" \
  --long-tokens "${SOAK_LONG_TOKENS:-0}" --long-seqs "${SOAK_LONG_SEQS:-4}" \
  --import-chunk "${SOAK_IMPORT_CHUNK:-0}" --impatient "${SOAK_IMPATIENT:-1}" || rc=$?
if ! kill -0 "$pid" 2>/dev/null; then
  echo "soak: indexerd died during the run; its log:" >&2
  tail -n 50 "$tmp/daemon.log" >&2
  exit 1
fi
if ((rc != 0)); then
  echo "soak: FAILED; the daemon's log (last 30 lines):" >&2
  tail -n 30 "$tmp/daemon.log" >&2
fi
exit "$rc"
