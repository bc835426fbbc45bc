#!/usr/bin/env bash
# The whole HIP build (-DGPU=HIP) in build-hip/ (BUILD_DIR), as deploy/test.sh
# --stage hip runs it. Where the device libraries link the architectures
# (a ROCm install), a normal `cmake --build` of every target. Where they do
# not (Debian 12: rocm-device-libs 5.2.3 has no gfx942, see the README's AMD
# section), CMake says so and configures compile-only: this script then
# compiles, from compile_commands.json with -fsyntax-only (every diagnostic,
# templates instantiated, no code generation: nothing would link them), each
# translation unit that sees the vendor: one that has, itself or in the
# project's headers it includes, a kernels/gpu/ header, a HIP header or a
# macro the GPU builds define (the gpu backend, its tests and benches, the
# CLI's device transport, HIP sources in their host pass); the others are
# the GPU=OFF builds' sources, which the test and sanitize stages compile.
# Then it builds hip_device_check (the device pass of each HIP source for
# each architecture, to gfx942 ISA); nothing is linked. Exits non-zero on
# the first failing compile.
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
python3 - "$dir" "$(nproc)" "$wrap" "$PWD" <<'PY'
import json, os, re, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
build, jobs, wrap, root = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
cmds = json.load(open(f"{build}/compile_commands.json"))
# Which sources see the vendor: a kernels/gpu/ or HIP header, or a macro the
# GPU builds define for plain C++ sources, in the file or in the project's
# headers it includes (quoted paths from the repository root or beside the
# including file, followed transitively); conditional includes count (more
# is checked, never less).
inc = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]', re.M)
gpu_macro = re.compile(r'\b(INDEXER_HAVE_GPU|INDEXER_CLI_GPU|__HIP_PLATFORM_AMD__)\b')
seen = {}
def sees_vendor(path):
    if path in seen:
        return seen[path]
    seen[path] = False
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return False
    hit = bool(gpu_macro.search(text))
    for kind, name in ([] if hit else inc.findall(text)):
        if name.startswith("kernels/gpu/") or name.startswith("hip/"):
            hit = True
            break
        if kind == '"':
            for cand in (os.path.join(root, name), os.path.join(os.path.dirname(path), name)):
                if os.path.isfile(cand) and sees_vendor(os.path.realpath(cand)):
                    hit = True
                    break
        if hit:
            break
    seen[path] = hit
    return hit
def vendor_tu(c):
    f = os.path.realpath(os.path.join(c["directory"], c["file"]))
    return " -x hip " in c["command"] or f.startswith(os.path.join(root, "kernels/gpu/")) or sees_vendor(f)
picked = [c for c in cmds if vendor_tu(c)]
def run(c):
    # The objects are never linked: semantic analysis (templates instantiated,
    # every diagnostic) is the check, without code generation or debug info.
    r = subprocess.run(wrap + c["command"] + " -fsyntax-only", shell=True, cwd=c["directory"],
                       capture_output=True, text=True)
    return c["file"], r.returncode, r.stderr
failed = 0
with ThreadPoolExecutor(jobs) as ex:
    for f, rc, err in ex.map(run, picked):
        if rc:
            failed += 1
            print(f"FAIL {f}\n{err}", file=sys.stderr)
hip = sum(1 for c in picked if " -x hip " in c["command"])
print(f"hip_build: compiled {len(picked) - failed}/{len(picked)} translation units that see "
      f"the vendor ({hip} HIP sources, host pass; -fsyntax-only), not linked; "
      f"{len(cmds) - len(picked)} others are the GPU=OFF builds' sources")
if not picked:
    print("hip_build: no translation unit sees the vendor: the scan is broken", file=sys.stderr)
    sys.exit(1)
sys.exit(1 if failed else 0)
PY
ninja -C "$dir" hip_device_check | tail -1
echo "hip_build: device passes: $(find "$dir/hip_device" -name '*.s' | wc -l) ISA files" \
     "($(ls "$dir/hip_device" | paste -sd ' '))"
