#!/usr/bin/env bash
# Builds the CPU image from a Debian 12 base made on this machine, runs it the
# way a cluster would (read-only root, non-root user, /tmp a tmpfs) and checks
# that its health check answers SERVING, that a demo run through every layer
# agrees with the client's reference and that SIGTERM ends it with status 0.
# No registry is needed: the base is
# debootstrap'ed from the apt mirror this machine is configured with and
# imported into the container engine.
#
# Usage: deploy/docker/build_cpu_image.sh [--engine podman|docker] [--tag TAG]
#                                         [--rebuild-base] [--no-smoke] [--base-only]
#   ENGINE      podman (default when installed) or docker
#   MIRROR      Debian mirror for debootstrap (default: the first Debian URI
#               in /etc/apt/sources.list.d/*.sources or sources.list, else
#               http://deb.debian.org/debian)
#   BASE_TAG    the imported base (default localhost/debian-local:bookworm);
#               made once, reused until --rebuild-base
#
# Needs root (debootstrap, rootful podman) and the packages debootstrap and
# podman (deploy/deps.sh --image installs them). Each phase prints its wall
# time. The image build compiles indexerd and indexer-cli from scratch
# (GPU=OFF) inside the build stage: most of the run time on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."

engine=${ENGINE:-}
tag=localhost/indexerd:cpu
rebuild_base=0
smoke=1
base_only=0
while (($#)); do
  case "$1" in
    --engine) engine=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --rebuild-base) rebuild_base=1; shift ;;
    --no-smoke) smoke=0; shift ;;
    --base-only) base_only=1; shift ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "build_cpu_image.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
if [[ -z $engine ]]; then
  if command -v podman >/dev/null; then engine=podman; else engine=docker; fi
fi
command -v "$engine" >/dev/null ||
  { echo "build_cpu_image.sh: $engine not found (deploy/deps.sh --image installs podman)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] ||
  { echo "build_cpu_image.sh: run as root (debootstrap and the rootful engine need it)" >&2; exit 1; }
base_tag=${BASE_TAG:-localhost/debian-local:bookworm}

# Podman inside a container may not be able to mount overlayfs (it works on
# the development machine); vfs always works (slower, more disk). An
# explicit STORAGE_DRIVER wins.
engine_args=()
if [[ $engine == podman ]]; then
  driver=${STORAGE_DRIVER:-}
  if [[ -z $driver ]]; then
    if podman --storage-driver overlay info >/dev/null 2>&1; then driver=overlay; else driver=vfs; fi
  fi
  engine_args=(--storage-driver "$driver")
  # cgroup v1 hosts without systemd: cgroupfs manager, no per-container
  # cgroup namespace requirements.
  [[ -d /run/systemd/system ]] || engine_args+=(--cgroup-manager cgroupfs)
  echo "engine: podman, storage driver $driver"
fi
eng() { "$engine" "${engine_args[@]}" "$@"; }

phase() { echo "== $1"; phase_t0=$SECONDS; }
phase_done() { echo "== $1: $((SECONDS - phase_t0)) s"; }

mirror=${MIRROR:-}
if [[ -z $mirror ]]; then
  mirror=$(grep -hs -E '^URIs:.*/debian/?$' /etc/apt/sources.list.d/*.sources | head -1 | awk '{print $2}')
  [[ -n $mirror ]] ||
    mirror=$(grep -hs -E '^deb .*/debian/? bookworm' /etc/apt/sources.list | head -1 | awk '{print $2}')
  mirror=${mirror:-http://deb.debian.org/debian}
fi

# 1. The base: a minimal bookworm root made by debootstrap, imported as an
#    image (no docker.io/library/debian pull).
if ((rebuild_base)) || ! eng image inspect "$base_tag" > /dev/null 2>&1; then
  phase "base: debootstrap bookworm from $mirror"
  rootfs=$(mktemp -d /var/tmp/indexerd-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" "$mirror" \
    > "$rootfs.log" 2>&1 || { tail -20 "$rootfs.log"; exit 1; }
  # The image's apt looks at the same mirror, plus updates and security.
  cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb ${mirror%/debian*}/debian-security bookworm-security main
EOF
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" --numeric-owner -c . |
    eng import --change 'CMD ["/bin/bash"]' - "$base_tag" > /dev/null
  rm -rf "$rootfs" "$rootfs.log"
  trap - EXIT
  phase_done "base"
else
  echo "== base: $base_tag exists (--rebuild-base makes it again)"
fi

((base_only)) && exit 0

# How containers can run on this host. A nested engine (CI runs in a
# container) may lack CAP_SYS_RESOURCE, so the engine's default rlimits
# (nofile 1048576) cannot be set, and crun refuses hybrid cgroup v1/v2
# hosts; runc with rlimits under the host's limits works there. The first
# set of run options under which `true` runs is used for build and run.
run_args=()
try_run() { "$engine" "$@" run --rm --network host "${run_args[@]}" "$base_tag" true > /dev/null 2>&1; }
if ! try_run "${engine_args[@]}"; then
  run_args=(--ulimit nofile=8192:8192 --ulimit nproc=8192:8192)
  [[ $engine == podman ]] && engine_args+=(--runtime runc)
  try_run "${engine_args[@]}" ||
    { echo "build_cpu_image.sh: $engine cannot run a container here (tried its defaults and: ${engine_args[*]} ${run_args[*]})" >&2; exit 1; }
fi
echo "engine: $engine ${engine_args[*]}, run options: ${run_args[*]:-(defaults)}"

# 2. The image. Host networking for the build: a nested engine often has no
#    working bridge network, and apt in the build needs the mirror.
phase "image: $tag (deploy/docker/Dockerfile.cpu)"
# --format docker: the OCI image format has no HEALTHCHECK; podman drops it.
fmt=()
[[ $engine == podman ]] && fmt=(--format docker)
eng build --network host "${fmt[@]}" "${run_args[@]}" --build-arg BASE="$base_tag" \
  -f deploy/docker/Dockerfile.cpu -t "$tag" .
phase_done "image"
eng image ls "$tag"

((smoke)) || exit 0

# 3. Smoke test: the daemon in the image as a cluster would run it (read-only
#    root, /tmp a tmpfs, no capabilities, non-root), then the image's own
#    HEALTHCHECK command, an info call, a checked demo run and a SIGTERM.
#    Without systemd podman logs errors about health-check timers; the check
#    itself is run on demand (podman healthcheck run).
phase "smoke: run $tag read-only, health check"
name=indexerd-smoke-$$
port=$((50100 + RANDOM % 800))
cleanup() { eng rm -f "$name" > /dev/null 2>&1 || true; }
trap cleanup EXIT
eng run -d "${run_args[@]}" --name "$name" --network host --read-only --tmpfs /tmp \
  --cap-drop ALL --security-opt no-new-privileges \
  -e INDEXERD_HEALTH_ADDR="127.0.0.1:$port" \
  "$tag" --profile demo --device cpu --listen "127.0.0.1:$port" > /dev/null
healthy=0
for _ in $(seq 120); do
  if eng exec "$name" indexer-cli --addr "127.0.0.1:$port" --connect-timeout 1 health \
       > /tmp/indexerd-smoke-health.$$ 2>&1; then
    healthy=1; break
  fi
  [[ $(eng inspect -f '{{.State.Running}}' "$name") == true ]] || break
  sleep 0.5
done
cat /tmp/indexerd-smoke-health.$$; rm -f /tmp/indexerd-smoke-health.$$
if ((!healthy)); then
  echo "smoke: FAILED: the daemon did not answer SERVING; its log:"
  eng logs "$name" 2>&1 | tail -30
  exit 1
fi
# The image's HEALTHCHECK as the engine runs it (podman: healthcheck run).
if [[ $engine == podman ]]; then
  eng healthcheck run "$name" && echo "smoke: podman healthcheck run: healthy"
fi
eng exec "$name" indexer-cli --addr "127.0.0.1:$port" info | head -8
[[ $(eng exec "$name" id -u) != 0 ]] || { echo "smoke: FAILED: runs as root"; exit 1; }
echo "smoke: user $(eng exec "$name" id -un) ($(eng exec "$name" id -u)), root read-only"
# Steps work on the read-only root: prefill and decode through every layer
# of the demo profile, each checked against the client's reference.
verdict=$(eng exec "$name" indexer-cli --addr "127.0.0.1:$port" demo --seqs 2 --decode-steps 2 |
  tr '\r' '\n' | tail -1) || true  # the verdict line says why
echo "smoke: demo: $verdict"
[[ $verdict == *': FULL' ]] || { echo "smoke: FAILED: demo"; exit 1; }
# SIGTERM drains and the daemon exits 0.
eng stop -t 30 "$name" > /dev/null
code=$(eng inspect -f '{{.State.ExitCode}}' "$name")
[[ $code == 0 ]] || { echo "smoke: FAILED: exit status $code after SIGTERM"; eng logs "$name" | tail; exit 1; }
echo "smoke: stopped by SIGTERM, exit status 0"
phase_done "smoke"
