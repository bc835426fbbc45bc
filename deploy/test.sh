#!/usr/bin/env bash
# One command from a fresh clone to a tested build: installs what is missing
# (the gfx942 compile-check toolchain included), builds, runs every test
# through ctest. GPU tests skip, with their reason, on a machine without one.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/deps.sh --test
deploy/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900
