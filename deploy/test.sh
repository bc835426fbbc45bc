#!/usr/bin/env bash
# One command from a fresh clone to a tested build, in named stages:
#
#   deps      the packages (deploy/deps.sh --test: the HIP toolchain,
#             clang-19 and its libFuzzer runtime)
#   test      deploy/build.sh into build/ (GPU=AUTO) and the whole ctest suite;
#             GPU tests skip, with their reason, on a machine without a GPU
#   hip       deploy/hip_build.sh: the -DGPU=HIP build in build-hip/ (gfx942;
#             compile-only where Debian's device libraries lack gfx942: every
#             translation unit that sees the vendor, host and device passes,
#             nothing linked)
#   sanitize  ASan + UBSan build (GPU=OFF) in build-asan/, unit + integration
#   tsan      ThreadSanitizer build (GPU=OFF, clang-19) in build-tsan/: the
#             engine's integration suite (engine_test), with Debian's
#             absl::Mutex made visible (tests/tsan/absl_sync_tsan.cc) and
#             uninstrumented libtbb's task handoffs suppressed (tests/tsan.supp)
#   fuzz      libFuzzer targets (clang-19, ASan + UBSan) in build-fuzz/, each
#             for FUZZ_SECONDS (default 60) from tests/fuzz/corpus, one per
#             core side by side
#   soak      tests/soak/soak.sh for SOAK_SECONDS (default 60) against
#             build/'s indexerd on the cpu backend (4 clients and one whose
#             calls time out after 0.3-100 ms), then its long-context
#             mode for SOAK_LONG_SECONDS (default 45): 4 clients x 4
#             sequences of 8192 tokens imported in chunks of 3000 (odd
#             offsets), a 56 MB cache (the pool fills), needles checked
#   k8s       deploy/k8s/check.py --self-test: yamllint, each overlay rendered,
#             every object against the Kubernetes API models, the deployment's
#             invariants, and proof that each check can fail (seconds)
#   image     deploy/docker/build_cpu_image.sh: a Debian 12 base made by
#             debootstrap, the CPU image built from it (podman), run read-only,
#             its health check answered, a checked demo run, SIGTERM exit 0
#             (as root: sudo when not)
#
# Usage: deploy/test.sh [--stage NAME]... [--skip NAME]...
# Each stage prints its wall time; a summary follows. The first failing
# stage ends the run (later stages may need its build). ccache is used when
# installed. Stage costs on CI's 2 cores: README, "Tests and CI".
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

all_stages=(deps test hip sanitize tsan fuzz soak k8s image)
only=()
skip=()
while (($#)); do
  case "$1" in
    --stage) only+=("$2"); shift 2 ;;
    --skip) skip+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown argument '$1' (expected --stage NAME or --skip NAME)" >&2; exit 2 ;;
  esac
done
for s in "${only[@]}" "${skip[@]}"; do
  [[ " ${all_stages[*]} " == *" $s "* ]] ||
    { echo "test.sh: unknown stage '$s' (expected one of: ${all_stages[*]})" >&2; exit 2; }
done

jobs=$(nproc)
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

# Configures (once) and builds a GPU=OFF variant. $1 = dir, rest = cmake args.
build_variant() {
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja -DGPU=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "${launcher[@]}" "$@" >/dev/null
}

stage_deps() { deploy/deps.sh --test; }

stage_test() {
  deploy/build.sh
  (cd build && ctest --output-on-failure -j "$jobs" --timeout 900)
}

stage_hip() { deploy/hip_build.sh; }

# UBSan only prints by default: halt so a report fails the test.
# -O0 -g1 (line tables: every report still names file:line), the tests'
# sources too (INDEXER_TEST_CXX_FLAGS empty): ASan + UBSan instrumentation
# optimized at -O1 was the longest part of CI (server_test.cc 66 s of g++
# at -O1, 35 s at -O0). ASan finds as much at -O0 (nothing is optimized
# away); the cpu backend's hot loops keep their -O3
# (kernels/cpu/CMakeLists.txt), so the suite runs in about 200 s (125 at
# -O1) while the build's compiler time drops by 37 % (2088 -> 1310 s).
stage_sanitize() {
  build_variant build-asan -DINDEXER_SANITIZE=ON -DINDEXER_TEST_CXX_FLAGS= \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O0 -g1 -DNDEBUG"
  cmake --build build-asan -j "$jobs"
  (cd build-asan &&
   ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
   UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
   ctest --output-on-failure -j "$jobs" --timeout 1800)
}

# clang: g++'s target_clones resolvers (the cpu code) run before TSan's
# runtime is up and crash an instrumented binary at load.
stage_tsan() {
  CC=clang-19 CXX=clang++-19 build_variant build-tsan -DINDEXER_TSAN=ON
  cmake --build build-tsan -j "$jobs" --target engine_test
  (cd build-tsan &&
   TSAN_OPTIONS="suppressions=$root/tests/tsan.supp:halt_on_error=1:second_deadlock_stack=1" \
   ctest --output-on-failure -j 1 --timeout 1800 -R '^engine_test$')
}

stage_fuzz() {
  CC=clang-19 CXX=clang++-19 build_variant build-fuzz -DINDEXER_FUZZ=ON
  cmake --build build-fuzz -j "$jobs" --target fuzz_step fuzz_release fuzz_write_entries fuzz_export fuzz_step_wire
  tests/fuzz/run.sh build-fuzz "${FUZZ_SECONDS:-60}"
}

stage_soak() {
  # The test stage's build; built here too when that stage was skipped.
  [[ -x build/server/indexerd && -x build/tests/soak/soak_driver ]] || deploy/build.sh
  tests/soak/soak.sh build "${SOAK_SECONDS:-60}"
  SOAK_LONG_TOKENS=8192 SOAK_IMPORT_CHUNK=3000 SOAK_CACHE_MB=56 \
    tests/soak/soak.sh build "${SOAK_LONG_SECONDS:-45}"
}

stage_k8s() {
  deploy/deps.sh --k8s
  /usr/bin/python3 deploy/k8s/check.py --self-test
}

# Root for debootstrap and rootful podman: sudo when not root, as deps does.
stage_image() {
  deploy/deps.sh --image
  local sudo=()
  [[ $(id -u) -ne 0 ]] && sudo=(sudo)
  "${sudo[@]}" deploy/docker/build_cpu_image.sh
}

names=()
times=()
results=()
summary() {
  echo
  echo "== summary"
  printf '%-10s %8s  %s\n' stage seconds result
  for i in "${!names[@]}"; do
    printf '%-10s %8s  %s\n' "${names[$i]}" "${times[$i]}" "${results[$i]}"
  done
  printf '%-10s %8s\n' total "$((SECONDS - start_all))"
}
start_all=$SECONDS
trap summary EXIT

for s in "${all_stages[@]}"; do
  if ((${#only[@]})) && [[ " ${only[*]} " != *" $s "* ]]; then continue; fi
  if [[ " ${skip[*]} " == *" $s "* ]]; then continue; fi
  echo "== stage $s"
  t0=$SECONDS
  names+=("$s")
  # A subshell outside any condition, so that set -e holds inside the stage.
  set +e
  (set -e; "stage_$s")
  rc=$?
  set -e
  times+=("$((SECONDS - t0))")
  if ((rc == 0)); then
    results+=(ok)
    echo "== stage $s: ok in $((SECONDS - t0)) s"
  else
    results+=("FAILED (exit $rc)")
    echo "== stage $s: FAILED (exit $rc) after $((SECONDS - t0)) s"
    exit "$rc"
  fi
done
