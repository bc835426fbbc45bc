#!/usr/bin/env bash
# Device-only compile of every gpu kernel source for gfx942 with hip-clang,
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
for src in "${here}"/*.cu; do
  name="$(basename "${src}" .cu)"
  if "${cxx}" -x hip --offload-arch="${arch}" --cuda-device-only -nogpulib -S \
      -std=c++20 -O2 -D__HIP_PLATFORM_AMD__ -I"${root}" \
      "${src}" -o "${out}/${name}.s"; then
    echo "ok   ${name}.cu (${arch})"
  else
    echo "FAIL ${name}.cu (${arch})" >&2
    status=1
  fi
done
exit ${status}
