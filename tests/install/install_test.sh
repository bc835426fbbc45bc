#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then only the installed tree:
# indexerd --check-config finds the demo profile under the prefix (not the
# source tree) and names the field of a bad one; the installed daemon
# serves a profile by name; the installed indexer-cli, the installed Python
# package and a program built against the installed CMake package
# (find_package(IndexerClient)) all talk to it.
# Usage: install_test.sh BUILD_DIR SOURCE_DIR [PYTHON]
set -euo pipefail
build=$1 src=$2 py=${3:-/usr/bin/python3}
dir=$(mktemp -d)
pid=
cleanup() {
  [[ -n $pid ]] && { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }
  rm -rf "$dir"
}
trap cleanup EXIT
prefix=$dir/prefix
cmake --install "$build" --prefix "$prefix" > "$dir/install.log"
for f in bin/indexerd bin/indexer-cli share/indexerd/configs/demo.textproto \
         share/indexerd/configs/deepseek-v3.2-fp8.textproto include/indexer/client.h \
         include/indexer/v1/indexer.pb.h share/indexerd/proto/indexer/v1/indexer.proto \
         lib/python3/dist-packages/indexer_client/__init__.py \
         lib/python3/dist-packages/indexer_client/_pb/indexer_pb2.py; do
  [[ -e $prefix/$f ]] || { echo "FAIL: $f not installed"; exit 1; }
done
[[ -n $(find "$prefix" -name IndexerClientConfig.cmake) ]] || { echo "FAIL: no package config"; exit 1; }

# Away from the source tree, with no config-dir hint.
cd "$dir"
unset INDEXERD_CONFIG_DIR
"$prefix/bin/indexerd" --check-config demo > "$dir/check.out"
cat "$dir/check.out"
grep -q "^config $prefix/share/indexerd/configs/demo.textproto: valid" "$dir/check.out" \
  || { echo "FAIL: the profile was not taken from the prefix"; exit 1; }
grep -q "^group fp8: layers 0-2 (3)" "$dir/check.out" || { echo "FAIL: no fp8 group line"; exit 1; }
grep -q "^total: [0-9]* bytes" "$dir/check.out" || { echo "FAIL: no total"; exit 1; }

# A bad profile: non-zero exit, the field named.
sed 's/head_dim: 128/head_dim: 100/' "$prefix/share/indexerd/configs/demo.textproto" > "$dir/bad.textproto"
if "$prefix/bin/indexerd" --check-config "$dir/bad.textproto" > "$dir/bad.out" 2>&1; then
  echo "FAIL: a bad profile was accepted"; cat "$dir/bad.out"; exit 1
fi
grep -q "head_dim" "$dir/bad.out" || { echo "FAIL: the field is not named"; cat "$dir/bad.out"; exit 1; }
# A misspelt key: the parser's error names it.
sed 's/^cache_mb:/cache_mbb:/' "$prefix/share/indexerd/configs/demo.textproto" > "$dir/typo.textproto"
if "$prefix/bin/indexerd" --check-config "$dir/typo.textproto" > "$dir/typo.out" 2>&1; then
  echo "FAIL: a misspelt key was accepted"; exit 1
fi
grep -q 'no field named "cache_mbb"' "$dir/typo.out" || { echo "FAIL: key not named"; cat "$dir/typo.out"; exit 1; }
if "$prefix/bin/indexerd" --check-config no-such-profile > "$dir/missing.out" 2>&1; then
  echo "FAIL: a missing profile was accepted"; exit 1
fi

# The installed daemon, the profile by name.
"$prefix/bin/indexerd" --profile demo --device cpu --threads 2 --cache-mb 64 \
  --listen 127.0.0.1:0 --port-file "$dir/port" --log-level warn &
pid=$!
for _ in $(seq 400); do [[ -s $dir/port ]] && break; kill -0 "$pid" || exit 1; sleep 0.05; done
[[ -s $dir/port ]] || { echo "FAIL: installed indexerd did not start"; exit 1; }
addr=127.0.0.1:$(cat "$dir/port")
"$prefix/bin/indexer-cli" --addr "$addr" info | tee "$dir/info"
grep -q "demo" "$dir/info"
PYTHONPATH=$prefix/lib/python3/dist-packages "$py" -c "
import sys, indexer_client
assert indexer_client.__file__.startswith('$prefix'), indexer_client.__file__
info = indexer_client.Client('$addr').server_info()
assert info.profile == 'demo', info.profile
print('python: profile', info.profile)"

# A front-end's build against the installed package.
cmake -S "$src/tests/install/consumer" -B "$dir/consumer" -G Ninja \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release > "$dir/consumer.log" \
  || { cat "$dir/consumer.log"; exit 1; }
cmake --build "$dir/consumer" >> "$dir/consumer.log" || { cat "$dir/consumer.log"; exit 1; }
"$dir/consumer/consumer" "$addr" | tee "$dir/consumer.out"
grep -q "^profile demo, 7 layers" "$dir/consumer.out"
echo "install_test: PASS"
