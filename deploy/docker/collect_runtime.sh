#!/bin/sh
# Runs in an image's build stage: copies the binaries and the profiles into
# OUT (default /out) in the layout of an install prefix (bin/,
# share/indexerd/configs/) and writes OUT/runtime-packages, the Debian/Ubuntu
# packages that own the shared libraries the binaries load. The runtime
# stage installs exactly those, so it never carries a compiler or a -dev
# package and the list cannot drift from what was linked.
# Usage: collect_runtime.sh BUILD_DIR SOURCE_DIR [OUT]
set -eu
build=$1 src=$2 out=${3:-/out}
mkdir -p "$out/bin" "$out/share/indexerd/configs"
cp "$build/server/indexerd" "$build/client/indexer-cli" "$out/bin/"
strip --strip-unneeded "$out/bin/indexerd" "$out/bin/indexer-cli"
cp "$src"/deploy/configs/*.textproto "$out/share/indexerd/configs/"
# A library from a toolkit outside the package manager (a GPU runtime in
# /usr/local or /opt) is the runtime stage's business, not this list's.
ldd "$out/bin/indexerd" "$out/bin/indexer-cli" |
  awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r lib; do
    # usrmerge: a library may be registered under /lib or /usr/lib.
    real=$(readlink -f "$lib")
    for p in "$lib" "$real" "/usr$lib" "${lib#/usr}" "/usr$real" "${real#/usr}"; do
      pkg=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1) && [ -n "$pkg" ] && {
        echo "$pkg"; break; }
    done
  done | sort -u > "$out/runtime-packages"
echo "runtime packages: $(tr '\n' ' ' < "$out/runtime-packages")"
