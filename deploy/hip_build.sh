#!/usr/bin/env bash
# The whole HIP build (-DGPU=HIP) in build-hip/ (BUILD_DIR), as deploy/test.sh
# --stage hip runs it. Where the device libraries link the architectures
# (a ROCm install), a normal `cmake --build` of every target. Where they do
# not (Debian 12: rocm-device-libs 5.2.3 has no gfx942, see the README's AMD
# section), CMake says so and configures compile-only: this script then
# compiles every translation unit of every target (daemon, client, tests,
# benches) from compile_commands.json with -fsyntax-only (every diagnostic,
# templates instantiated, no code generation: nothing would link them), HIP
# sources in their host pass, and builds hip_device_check (their device pass
# for each architecture, to gfx942 ISA); nothing is linked. Exits non-zero on the first failing compile.
# Usage: deploy/hip_build.sh [extra cmake args]   (CXX defaults to clang++-19)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${BUILD_DIR:-build-hip}
cxx=${HIP_CXX:-clang++-19}
cc=${HIP_CC:-${cxx/clang++/clang}}
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
mkdir -p "$dir"
if ! cmake -S . -B "$dir" -G Ninja -DGPU=HIP -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
    "${launcher[@]}" "$@" > "$dir/configure.log" 2>&1; then
  cat "$dir/configure.log" >&2
  echo "hip_build: configure failed" >&2
  exit 1
fi
# What the configure decided (architectures, link or compile-only, why).
grep -E -A4 "HIP:|gpu backend" "$dir/configure.log" | grep -v "^--$" || true

# Only a compile-only configuration has the hip_device_check target.
if ! grep -q 'hip_device_check' "$dir/build.ninja"; then
  cmake --build "$dir" -j "$(nproc)"
  exit 0
fi

# Compile-only. Generated sources first (protobuf / gRPC stubs), then every
# compile command, then the device passes.
gen=$(ninja -C "$dir" -t targets all | sed -n 's/^\([^:]*\.pb\.\(cc\|h\)\): .*/\1/p')
# shellcheck disable=SC2086
ninja -C "$dir" $gen >/dev/null
# compile_commands.json leaves the compiler launcher out: ccache is put back.
wrap=""
command -v ccache >/dev/null && wrap="ccache "
python3 - "$dir" "$(nproc)" "$wrap" <<'PY'
import json, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
build, jobs, wrap = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cmds = json.load(open(f"{build}/compile_commands.json"))
def run(c):
    # The objects are never linked: semantic analysis (templates instantiated,
    # every diagnostic) is the check, without code generation or debug info.
    r = subprocess.run(wrap + c["command"] + " -fsyntax-only", shell=True, cwd=c["directory"],
                       capture_output=True, text=True)
    return c["file"], r.returncode, r.stderr
failed = 0
with ThreadPoolExecutor(jobs) as ex:
    for f, rc, err in ex.map(run, cmds):
        if rc:
            failed += 1
            print(f"FAIL {f}\n{err}", file=sys.stderr)
hip = sum(1 for c in cmds if " -x hip " in c["command"])
print(f"hip_build: compiled {len(cmds) - failed}/{len(cmds)} translation units "
      f"({hip} HIP sources, host pass; -fsyntax-only), not linked")
sys.exit(1 if failed else 0)
PY
ninja -C "$dir" hip_device_check | tail -1
echo "hip_build: device passes: $(find "$dir/hip_device" -name '*.s' | wc -l) ISA files" \
     "($(ls "$dir/hip_device" | paste -sd ' '))"
