#!/usr/bin/env bash
# One command from a fresh clone to a serving daemon: installs what is
# missing, builds, starts indexerd on the best device present (a GPU when
# one is there and built in, else the cpu backend).
# Usage: deploy/serve.sh [PROFILE] [extra indexerd flags...]   (default: demo)
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-demo}"
shift || true
deploy/deps.sh
deploy/build.sh
exec build/server/indexerd --profile "$profile" --device auto --listen "${LISTEN:-127.0.0.1:50061}" "$@"
