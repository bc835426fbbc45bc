#!/usr/bin/env bash
# Device-only compile of every gpu kernel source (and the MFMA model test)
# for gfx942 with hip-clang,
# as CI runs it on a machine without ROCm or a GPU (Debian: clang-19,
# lld-19, libamdhip64-dev). Installs nothing; exits non-zero on the first
# failure. Usage: kernels/gpu/hip_compile_check.sh [clang++ binary] [arch]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
cxx="${1:-${HIP_CLANG:-clang++-19}}"
arch="${2:-gfx942}"
out="$(mktemp -d)"
trap 'rm -rf "${out}"' EXIT
if ! command -v "${cxx}" >/dev/null; then
  echo "hip_compile_check: ${cxx} not found (apt-get install clang-19 lld-19 libamdhip64-dev)" >&2
  exit 2
fi
status=0
compile() {  # source, arch
  local name
  name="$(basename "$1" .cu)"
  if "${cxx}" -x hip --offload-arch="$2" --cuda-device-only -nogpulib -S \
      -std=c++20 -O2 -D__HIP_PLATFORM_AMD__ -I"${root}" \
      "$1" -o "${out}/${name}-$2.s"; then
    echo "ok   ${1#"${root}"/} ($2)"
  else
    echo "FAIL ${1#"${root}"/} ($2)" >&2
    status=1
  fi
}
# The MFMA model test too: it calls every Mfma* wrapper of gpu_compat.h.
mfma=("${here}"/amd/*.cu "${root}"/tests/gpu/mfma_model_test.cu)
for src in "${here}"/*.cu "${mfma[@]}"; do
  compile "${src}" "${arch}"
done
# The wave64 MFMA sources also for gfx950 (OCP FP8, the scaled FP4 MFMA),
# where the compiler knows it (LLVM 20 or newer).
if echo 'int x;' | "${cxx}" -x hip --offload-arch=gfx950 --cuda-device-only -nogpulib -S - -o /dev/null 2>/dev/null; then
  for src in "${mfma[@]}"; do compile "${src}" gfx950; done
else
  echo "skip gfx950: ${cxx} does not know gfx950 (needs LLVM >= 20)"
fi
exit ${status}
