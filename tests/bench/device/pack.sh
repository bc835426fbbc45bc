#!/usr/bin/env bash
# Runs HERE (no GPU needed): builds the tree with CUDA for sm_90a into
# build-gpu/ and packs what a device run needs into dev/ (git-ignored):
# stripped binaries, the shared libraries they load that a bare device image
# lacks (gRPC, protobuf, Abseil, TBB, spdlog, ...: found with ldd), the
# Python package with its generated stubs, and SOURCE.txt naming the commit.
# Then carry `dev` in the device call and run tests/bench/device/run.sh
# (README.md here: the stages). BUILD_DIR=build packs deploy/build.sh's
# tree instead (GPU=AUTO finds the same CUDA, sm_90a): no second build.
# BASE_BENCH=FILE copies another indexer_gpu_bench (e.g. the parent commit's)
# into dev/base/ for run.sh's kab stage; --xz also writes
# devpack/dev.tar.xz (git-ignored), the pack compressed under the device
# tool's carry limit: carry devpack, and run.sh unpacks it.
set -euo pipefail
xz_out=0
for a in "$@"; do
  case $a in
    --xz) xz_out=1 ;;
    *) echo "pack.sh: unknown argument '$a' (expected --xz)" >&2; exit 2 ;;
  esac
done
# BASE_BENCH as the caller named it, before the cd below.
[[ -n ${BASE_BENCH:-} ]] && BASE_BENCH=$(realpath "$BASE_BENCH")
cd "$(dirname "$0")/../../.."
export PATH=/usr/local/cuda/bin:$PATH
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
bd=${BUILD_DIR:-build-gpu}
if [[ $bd == build-gpu ]]; then
  cmake -S . -B build-gpu -G Ninja -DGPU=CUDA -DCUDA_ARCH=90a -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
else
  grep -q '^CMAKE_CUDA_COMPILER:.*nvcc' "$bd/CMakeCache.txt" ||
    { echo "pack: $bd is not a CUDA build"; exit 1; }
fi
cmake --build "$bd" -j"$(nproc)"
rm -rf dev && mkdir -p dev/bin dev/lib
# Every GPU test the build made (run.sh's suite and sanitize run them all),
# their helper, the gRPC suites, the daemon, the CLI and the benches.
gpu_tests=$(find "$bd"/tests/gpu -maxdepth 1 -type f -executable -name '*_test' -printf '%f\n' | sort)
[[ -n $gpu_tests ]] || { echo "pack: no GPU tests in $bd/tests/gpu (was CUDA found?)"; exit 1; }
printf '%s\n' $gpu_tests > dev/gpu-tests.txt
for b in $(printf 'tests/gpu/%s ' $gpu_tests) tests/gpu/ipc_export_helper \
         tests/integration/server_test tests/integration/serving_test \
         tests/integration/regions_test tests/integration/inline_path_test \
         tests/integration/ring_test client/indexer-cli server/indexerd \
         tests/bench/indexer_gpu_bench tests/bench/grpc_echo_bench tests/soak/soak_driver; do
  [[ -f $bd/$b ]] || { echo "pack: no $b"; exit 1; }
  cp "$bd/$b" dev/bin/ && strip "dev/bin/$(basename "$b")"
done
# Libraries of the build machine's distribution; the C/C++ runtime of the
# device image is newer and stays.
ldd dev/bin/* 2>/dev/null | awk '/=> \//{print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" dev/lib/; done
[[ -d $bd/python ]] && cp -rL "$bd/python" dev/python
# Tests run helpers from the absolute paths they were built with: run.sh
# links those paths to dev/bin.
: > dev/links.txt
for pair in "tests/integration/server_test client/indexer-cli" \
            "tests/gpu/device_regions_test tests/gpu/ipc_export_helper"; do
  set -- $pair
  grep -aom1 "/[[:alnum:]_./+-]*/$2" "$bd/$1" >> dev/links.txt || true
done
{ git log -1 --format='%H %s'; git status --porcelain | head -20; } > dev/SOURCE.txt
if [[ -n ${BASE_BENCH:-} ]]; then
  mkdir -p dev/base && cp "$BASE_BENCH" dev/base/indexer_gpu_bench && strip dev/base/indexer_gpu_bench
  echo "base: $BASE_BENCH" >> dev/SOURCE.txt
fi
du -sh dev
if ((xz_out)); then
  rm -rf devpack && mkdir devpack
  tar -cf - dev | xz -T"$(nproc)" -1 > devpack/dev.tar.xz
  du -sh devpack/dev.tar.xz
fi
