"""The Python client over mutual TLS (README "Security"): a daemon started
with a server certificate and a client CA; certificates are generated at
test time by tests/integration/make_test_certs.sh (openssl). Client A's
sequence is invisible to client B (identity = the certificate's SAN), and a
client without a certificate is refused.
"""

import pathlib
import subprocess
import tempfile
import unittest

import grpc
import numpy as np

import indexer_client as ic
from indexer_client import reference
from daemon import Daemon, _REPO

_CERT_SCRIPT = _REPO / "tests" / "integration" / "make_test_certs.sh"


class MutualTlsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = tempfile.TemporaryDirectory(prefix="indexer-py-pki-")
        subprocess.run(["sh", str(_CERT_SCRIPT), cls.pki.name], check=True)
        p = pathlib.Path(cls.pki.name)
        cls.paths = p
        cls.daemon = Daemon("demo", extra=("--tls-cert", str(p / "server.pem"),
                                           "--tls-key", str(p / "server.key"),
                                           "--tls-ca", str(p / "ca.pem")))

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        cls.pki.cleanup()

    def client(self, who):
        p = self.paths
        c = ic.Client(self.daemon.addr, timeout=30, tls_ca=str(p / "ca.pem"),
                      tls_cert=str(p / f"{who}.pem"), tls_key=str(p / f"{who}.key"))
        self.addCleanup(c.close)
        return c

    def test_identity_namespaces_sequences(self):
        a, b = self.client("client-a"), self.client("client-b")
        info = a.server_info()
        # A creates "s" (one token, every layer, zero inputs of the right
        # shapes); the committed lengths tell whose "s" a step reached.
        self.assertEqual(_one_token_step(a, info, "s", 0, create=True), [1])
        # B cannot extend or release A's "s"; it can create its own.
        with self.assertRaises(grpc.RpcError) as e:
            _one_token_step(b, info, "s", 0, create=False)
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(grpc.RpcError) as e:
            b.release(["s"])
        self.assertEqual(e.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertEqual(_one_token_step(b, info, "s", 0, create=True), [1])
        self.assertEqual(_one_token_step(a, info, "s", 1, create=False), [2])
        self.assertGreater(a.release(["s"]), 0)
        self.assertGreater(b.release(["s"]), 0)

    def test_client_without_certificate_is_refused(self):
        c = ic.Client(self.daemon.addr, timeout=5, tls_ca=str(self.paths / "ca.pem"))
        self.addCleanup(c.close)
        with self.assertRaises(grpc.RpcError) as e:
            c.server_info()
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)

    def test_half_a_key_pair_is_a_clear_error(self):
        with self.assertRaisesRegex(ValueError, "tls_cert, tls_key"):
            ic.Client(self.daemon.addr, tls_cert=str(self.paths / "client-a.pem"))


def _one_token_step(client, info, name, old_len, create):
    """A step of one token over every layer with zero inputs; its lengths."""
    groups = {g.name: g for g in info.groups}
    with client.step([(name, 1, create)]) as step:
        for layer in info.layers:
            g = groups[layer.group]
            d, h = g.head_dim, layer.num_heads
            n_new = reference.new_entries(old_len, 1, g.compress_ratio)
            k = np.zeros((n_new, d), np.float32)
            q = np.zeros((1, h, d), np.float32)
            if layer.role == "block":
                step.run_layer(layer.layer, k=k, q=q)
            else:
                step.run_layer(layer.layer, k=k, q=q, weights=np.ones((1, h), np.float32))
        return step.commit()


if __name__ == "__main__":
    unittest.main()
