#!/usr/bin/env bash
# Configures and builds indexerd into ./build (GPU=AUTO: the CUDA kernels are
# built when nvcc is found, e.g. in /usr/local/cuda/bin). Configuring again
# on every run is cheap and picks up tools installed since (clang-19 for the
# gfx942 compile check). ccache is used when installed.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -d /usr/local/cuda/bin ]] && export PATH="/usr/local/cuda/bin:$PATH"
gen=()
if [[ ! -f build/CMakeCache.txt ]] && command -v ninja >/dev/null; then gen=(-G Ninja); fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache
            -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build "${gen[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPU="${GPU:-AUTO}" "$@"
cmake --build build -j "$(nproc)"
