#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages indexerd builds with, skipping those
# already present. Usage: deploy/deps.sh [--test] [--hip] [--k8s|--image]
# (--test adds clang-19's runtime libraries, libFuzzer and the sanitizers
# for the fuzz stage, and the HIP set; --hip the HIP set alone: Debian's
# ROCm 5.2 pieces for the -DGPU=HIP build, deploy/hip_build.sh; --k8s: only
# the manifest checker's yamllint and python3-kubernetes; --image: only
# debootstrap and podman for deploy/docker/build_cpu_image.sh). The python3-*
# packages are the runtime of the Python client (client/python; its stubs
# come from protobuf-compiler-grpc's grpc_python_plugin of the same release)
# and of its ctest, python_client_test; they are in the main list because
# front-ends use the client, not only the tests.
set -euo pipefail

pkgs=(build-essential cmake ninja-build pkg-config
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libabsl-dev libspdlog-dev libtbb-dev libcli11-dev libgtest-dev libgmock-dev
      python3-grpcio python3-protobuf python3-numpy
      libcpp-httplib-dev  # the metrics endpoint (indexerd --metrics-listen)
      # google/rpc/{status,error_details}.proto (error details), and the
      # grpc.reflection stubs of reflection_test: .proto files only
      golang-github-gogo-googleapis-dev grpc-proto
      openssl)  # openssl: tls_test generates its certificates at test time
# The HIP build: clang-19 compiles HIP (-x hip), lld-19 links AMD code
# objects, clang-tools-19 has clang-offload-bundler, libamdhip64-dev the HIP
# headers and runtime, rocm-device-libs the device bitcode (ocml, ockl; no
# gfx942 in Debian 12's 5.2.3, see the README's AMD section), hipcc the
# hipconfig that locates them.
hip_pkgs=(clang-19 lld-19 clang-tools-19 libamdhip64-dev rocm-device-libs hipcc)
for arg in "$@"; do
  case "$arg" in
    # xz-utils: run_sh_test unpacks a compressed device pack (tar -J).
    --test) pkgs+=(libclang-rt-19-dev xz-utils "${hip_pkgs[@]}") ;;
    --hip) pkgs+=("${hip_pkgs[@]}") ;;
    # Only what the stage needs (its own list, not the build's).
    --k8s) pkgs=(yamllint python3-yaml python3-kubernetes) ;;
    --image) pkgs=(debootstrap podman runc uidmap) ;;
    *) echo "deps.sh: unknown argument '$arg' (expected --test, --hip, --k8s or --image)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
