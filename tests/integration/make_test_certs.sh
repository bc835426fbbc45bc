#!/bin/sh
# Test PKI for tls_test, generated fresh at test time into DIR (valid 2 days):
#   ca, ca2            two independent CAs
#   server, server2    SAN IP:127.0.0.1, DNS:localhost; signed by ca / ca2
#   client-a, client-b SAN DNS:client-a / DNS:client-b; signed by ca
#   client-x           SAN DNS:client-x; signed by ca2 (untrusted by the daemon)
# Usage: make_test_certs.sh DIR
set -eu
cd "$1"
ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$1.key" -out "$1.pem" -subj "/CN=$2" \
    -addext basicConstraints=critical,CA:TRUE \
    -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
}
leaf() {  # name ca cn san eku
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\n' "$4" "$5" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}
ca ca "indexer test CA"
ca ca2 "indexer test CA 2"
leaf server ca "indexerd" "IP:127.0.0.1,DNS:localhost" serverAuth
leaf server2 ca2 "indexerd rotated" "IP:127.0.0.1,DNS:localhost" serverAuth
leaf client-a ca "client-a" "DNS:client-a" clientAuth
leaf client-b ca "client-b" "DNS:client-b" clientAuth
leaf client-x ca2 "client-x" "DNS:client-x" clientAuth
