#!/usr/bin/env bash
# Configures and builds indexerd into ./build (GPU=AUTO: the CUDA kernels are
# built when nvcc is found, e.g. in /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d /usr/local/cuda/bin ]] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f build/CMakeCache.txt ]]; then
  cmake -S . -B build "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPU="${GPU:-AUTO}" "$@"
fi
cmake --build build -j "$(nproc)"
