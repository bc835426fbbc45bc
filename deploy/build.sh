#!/usr/bin/env bash
# Configures and builds indexerd into ./build (GPU=AUTO: the CUDA kernels are
# built when nvcc is found, e.g. in /usr/local/cuda/bin). Configuring again
# on every run is cheap and picks up tools installed since (clang-19 for the
# gfx942 compile check).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d /usr/local/cuda/bin ]] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
if [[ ! -f build/CMakeCache.txt ]] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPU="${GPU:-AUTO}" "$@"
cmake --build build -j "$(nproc)"
