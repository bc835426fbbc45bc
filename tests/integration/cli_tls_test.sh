#!/usr/bin/env bash
# indexerd's and indexer-cli's TLS flags end to end (cpu backend, demo
# profile): mutual TLS with certificates made at test time, refused
# plaintext and certificate-less clients, a demo run over mTLS, and an
# authorization policy that denies Release to one client.
# Usage: cli_tls_test.sh INDEXERD INDEXER_CLI MAKE_TEST_CERTS
set -euo pipefail
indexerd=$1 cli=$2 make_certs=$3
dir=$(mktemp -d)
pid=
trap '[[ -n $pid ]] && { kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; }; rm -rf "$dir"' EXIT
"$make_certs" "$dir"
cat > "$dir/policy.json" <<'JSON'
{"name": "cli-test",
 "deny_rules": [{"name": "no-release-for-b", "source": {"principals": ["client-b"]},
                 "request": {"paths": ["/indexer.v1.Indexer/Release"]}}],
 "allow_rules": [{"name": "certified", "source": {"principals": ["*"]}}]}
JSON
"$indexerd" --profile demo --device cpu --threads 2 --listen 127.0.0.1:0 \
  --port-file "$dir/port" --log-level warn --drain-delay-ms 0 \
  --tls-cert "$dir/server.pem" --tls-key "$dir/server.key" --tls-ca "$dir/ca.pem" \
  --tls-refresh-s 1 --authz-policy "$dir/policy.json" &
pid=$!
for _ in $(seq 200); do [[ -s $dir/port ]] && break; sleep 0.05; done
[[ -s $dir/port ]] || { echo "indexerd did not start"; exit 1; }
addr=127.0.0.1:$(cat "$dir/port")
as() {  # as CLIENT ARGS...: indexer-cli under mutual TLS as CLIENT
  local who=$1; shift
  "$cli" --addr "$addr" --connect-timeout 3 --tls-ca "$dir/ca.pem" \
    --tls-cert "$dir/$who.pem" --tls-key "$dir/$who.key" "$@"
}
as client-a info > "$dir/info"
grep -q "profile" "$dir/info"
as client-a --tls-server-name localhost demo --seqs 2 --decode-steps 2
# Refused: plaintext, and TLS without a client certificate.
if "$cli" --addr "$addr" --connect-timeout 2 info > /dev/null 2>&1; then
  echo "FAIL: a plaintext client was served"; exit 1
fi
if "$cli" --addr "$addr" --connect-timeout 2 --tls-ca "$dir/ca.pem" info > /dev/null 2>&1; then
  echo "FAIL: a client without a certificate was served"; exit 1
fi
# The policy: client-b may not release; client-a may (its own namespace has
# no "x": NOT_FOUND, past the policy).
if as client-b release --name x 2> "$dir/b.err"; then
  echo "FAIL: client-b released"; exit 1
fi
grep -q "PERMISSION_DENIED" "$dir/b.err" || { cat "$dir/b.err"; exit 1; }
if as client-a release --name x 2> "$dir/a.err"; then
  echo "FAIL: releasing an unknown sequence succeeded"; exit 1
fi
grep -q "NOT_FOUND" "$dir/a.err" || { cat "$dir/a.err"; exit 1; }
kill -0 $pid
echo "cli_tls_test: ok"
