"""End-to-end tests of the Python client against indexerd on the cpu
backend (demo profile), plus the numpy codecs on their own.

Run: PYTHONPATH=build/python INDEXERD=build/server/indexerd \
       python3 -m unittest -v test_client   (from client/python/tests)
ctest runs it as python_client_test.
"""

import itertools
import os
import socket
import unittest

import grpc
import numpy as np

import indexer_client as ic
from indexer_client import DataType, fp8, reference
from daemon import Daemon
from workload import Workload

_daemon = None
_ids = itertools.count(1000)


def setUpModule():
    global _daemon
    _daemon = Daemon("demo")


def tearDownModule():
    if _daemon is not None:
        _daemon.stop()


def fresh_ids(n):
    return [next(_ids) for _ in range(n)]


class ClientTestBase(unittest.TestCase):
    def setUp(self):
        self.client = ic.Client(_daemon.addr, client_id="py-test", timeout=120)
        # Cleanups run last-in first-out: regions a test adds close first.
        self.addCleanup(self.client.close)
        self.info = self.client.server_info()

    def run_step(self, wl, batch, create, layers=None, transport=None):
        """One committed step over every layer (or `layers`); returns
        {layer: LayerResult} after checking every layer's top-k."""
        layers = [l for l in wl.layers if layers is None or l.layer in layers]
        sent = []
        with self.client.step([(s, q, create) for s, q in batch]) as step:
            for layer in layers:
                args, n_new = wl.layer_inputs(layer, batch)
                if transport is None:
                    res = step.run_layer(layer.layer, **args)
                    topk = res.topk
                else:
                    res, topk = transport(step, layer, args)
                sent.append((layer, args, n_new, res, topk))
            lengths = step.commit()
        for layer, args, n_new, _, _ in sent:
            wl.record(layer, batch, args, n_new)
        self.assertEqual(lengths, wl.commit_lengths(batch))
        for layer, args, _, res, topk in sent:
            self.assertEqual(res.layer, layer.layer)
            self.assertGreater(res.timings["total_us"], 0)
            problems = wl.check(layer, batch, args, topk)
            self.assertEqual(problems, [], f"layer {layer.layer} ({layer.role}): "
                             + "; ".join(problems[:5]))
        return {layer.layer: res for layer, _, _, res, _ in sent}


class CodecTest(unittest.TestCase):
    def test_e4m3_encode_is_round_to_nearest_even_saturating(self):
        codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)], np.uint8)
        values = fp8.decode_e4m3(codes).astype(np.float64)
        self.assertTrue((fp8.encode_e4m3(values.astype(np.float32)) == codes).all())
        # Brute force over random magnitudes, midpoints and out-of-range values.
        rng = np.random.default_rng(1)
        pos = np.unique(values[values > 0])
        mids = (pos[:-1] + pos[1:]) / 2
        x = np.concatenate([rng.standard_normal(20000) * 10 ** rng.uniform(-4, 3, 20000),
                            mids, -mids, [500.0, -1e6, 1e-12, -1e-12, 0.0]]).astype(np.float32)
        grid = np.concatenate([[0.0], pos])
        mag = np.minimum(np.abs(x.astype(np.float64)), 448.0)
        idx = np.searchsorted(grid, mag)
        lo = grid[np.clip(idx - 1, 0, grid.size - 1)]
        hi = grid[np.clip(idx, 0, grid.size - 1)]
        lo_code = fp8.encode_e4m3(lo.astype(np.float32)).astype(int)
        pick_hi = (hi - mag < mag - lo) | ((hi - mag == mag - lo) & (lo_code % 2 == 1))
        want = np.where(pick_hi, hi, lo) * np.sign(x)
        got = fp8.decode_e4m3(fp8.encode_e4m3(x)).astype(np.float64)
        np.testing.assert_array_equal(got, want)
        # Sign kept on values that round to zero.
        self.assertEqual(int(fp8.encode_e4m3(np.float32([-1e-12]))[0]), 0x80)

    def test_quantizers_follow_spec_scales(self):
        k = np.array([[448.0] + [0.0] * 127, [449.0] + [1.0] * 127], np.float32)
        entries = fp8.quantize_k(k, ue8m0=True)
        _, scales = fp8.decode_k(entries, 128)
        np.testing.assert_array_equal(scales, [1.0, 2.0])  # smallest 2^e with a <= 448 * 2^e
        entries = fp8.quantize_k(k, ue8m0=False)
        _, scales = fp8.decode_k(entries, 128)
        np.testing.assert_array_equal(scales, np.float32([448.0, 449.0]) / np.float32(448.0))
        codes, s = fp8.quantize_q(np.full((1, 2, 128), 3.0, np.float32))
        np.testing.assert_array_equal(s, [[2.0 ** -7] * 2])  # 3 / 448 <= 2^-7
        self.assertTrue((fp8.decode_e4m3(codes) == 384.0).all())

    def test_bf16_rounds_to_nearest_even(self):
        x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, 1.0 + 2 ** -8 + 2 ** -20, -2.5],
                     np.float32)
        bits = ic.to_bf16_bits(x)
        np.testing.assert_array_equal(ic.from_bf16_bits(bits),
                                      np.float32([1.0, 1.0, 1.0 + 2 ** -6, 1.0 + 2 ** -7, -2.5]))
        t = ic.to_tensor(x, DataType.BF16)
        self.assertEqual(len(t.data), 10)
        np.testing.assert_array_equal(ic.from_tensor(t), bits)

    def test_tensor_helpers_check_dtype_and_shape(self):
        t = ic.to_tensor(np.arange(6, dtype=np.int32).reshape(2, 3))
        self.assertEqual((t.dtype, list(t.shape), len(t.data)), (DataType.INT32, [2, 3], 24))
        np.testing.assert_array_equal(ic.from_tensor(t), np.arange(6).reshape(2, 3))
        with self.assertRaisesRegex(ic.TensorError, r"q: expected shape \[2, 4\], got \[2, 3\]"):
            ic.to_tensor(np.zeros((2, 3), np.float32), shape=(2, 4), what="q")
        with self.assertRaisesRegex(ic.TensorError, "FP8_E4M3 takes numpy uint8"):
            ic.to_tensor(np.zeros(4, np.float32), DataType.FP8_E4M3)
        with self.assertRaisesRegex(ic.TensorError, "float64 has no default"):
            ic.to_tensor(np.zeros(4))
        t.data = t.data[:-1]
        with self.assertRaisesRegex(ic.TensorError, r"expected \[2, 3\] INT32 \(24 bytes\), got 23"):
            ic.from_tensor(t)
        with self.assertRaisesRegex(ic.TensorError, "multiple of 16"):
            ic.ref_tensor(DataType.FP32, [4], region=1, offset=8)

    def test_arena_packs_at_16_byte_offsets(self):
        a = ic.Arena(64)
        self.assertEqual([a.alloc(3), a.alloc(17), a.alloc(16)], [0, 16, 48])
        with self.assertRaises(ic.RegionError):
            a.alloc(1)
        a.reset()
        self.assertEqual(a.alloc(64), 0)
        self.assertEqual(ic.packed_size(3, 17, 16), 64)


class ServerInfoTest(ClientTestBase):
    def test_fields(self):
        info = self.info
        self.assertEqual(info.profile, "demo")
        self.assertEqual(info.next_n, 2)
        self.assertTrue(info.device.startswith("cpu"), info.device)
        self.assertTrue({"dense", "fp8", "mxfp4", "block", "import", "release"}
                        <= set(info.features), list(info.features))
        self.assertEqual([g.name for g in info.groups], ["fp8", "mxfp4", "block"])
        fp8g = info.groups[0]
        self.assertEqual((fp8g.kv_format, fp8g.head_dim, fp8g.page_entries, fp8g.entry_bytes,
                          list(fp8g.layers)), ("fp8", 128, 64, 132, [0, 1, 2]))
        self.assertEqual(info.groups[1].compress_ratio, 4)
        self.assertEqual([l.role for l in info.layers],
                         ["dense", "candidate_source", "candidate_consumer", "dense", "dense",
                          "block", "block"])
        self.assertEqual((info.layers[0].num_heads, info.layers[0].topk), (16, 64))
        self.assertEqual(info.layers[2].candidate_source, 1)
        self.assertEqual((info.layers[5].topk_blocks, info.layers[5].init_blocks,
                          info.layers[5].local_blocks), (6, 1, 2))
        self.assertGreater(info.max_message_bytes, 0)


class StepTest(ClientTestBase):
    def test_prefill_and_decode_every_layer_against_reference(self):
        wl = Workload(self.info, seed=7)
        ids = fresh_ids(3)
        seqs_before = self.client.server_info().sequences
        self.run_step(wl, [(ids[0], 70), (ids[1], 5), (ids[2], 130)], create=True)
        self.assertEqual(self.client.server_info().sequences, seqs_before + 3)
        for q_lens in ([1, 2, 1], [2, 2, 2], [1, 1, 1]):
            self.run_step(wl, list(zip(ids, q_lens)), create=False)
        self.assertEqual([wl.seq_len[i] for i in ids], [74, 10, 134])

    def test_fp32_k_quantized_by_the_daemon_matches_client_quantizer(self):
        # Two sequences with the same K, one as FP32 (the daemon quantizes,
        # SPEC §3) and one pre-quantized by indexer_client.fp8, then the same
        # query rows: identical stores give identical top-k sets.
        a, b = fresh_ids(2)
        rng = np.random.default_rng(3)
        n, h, d = 90, 16, 128
        k = (rng.standard_normal((n, d)) * rng.uniform(0.01, 50, (n, 1))).astype(np.float32)
        ue8m0 = self.info.groups[0].ue8m0
        entries = fp8.quantize_k(k, ue8m0)
        q = rng.standard_normal((n, h, d), dtype=np.float32)
        w = rng.uniform(-1, 1, (n, h)).astype(np.float32)
        got = {}
        for sid, kk in ((a, k), (b, entries)):
            with self.client.step([(sid, n, True)]) as s:
                got[sid] = s.run_layer(0, k=kk, q=q, weights=w).topk
                s.abort()
        np.testing.assert_array_equal(np.sort(got[a], axis=1), np.sort(got[b], axis=1))

    def test_q_forms_agree_bf16_fp32_and_client_quantized_fp8(self):
        # The same query as BF16 bits, as FP32 of the same values, and as
        # FP8 codes quantized by fp8.quantize_q with its scale folded into the
        # weights (what the daemon does with FP32 Q, SPEC §3): one top-k.
        sid = fresh_ids(1)[0]
        rng = np.random.default_rng(4)
        n, h, d = 100, 16, 128
        entries = fp8.quantize_k(rng.standard_normal((n, d), dtype=np.float32),
                                 self.info.groups[0].ue8m0)
        bits = ic.to_bf16_bits(rng.standard_normal((n, h, d), dtype=np.float32))
        q32 = ic.from_bf16_bits(bits)
        w = rng.uniform(-1, 1, (n, h)).astype(np.float32)
        codes, s = fp8.quantize_q(q32)
        forms = {"bf16": dict(q=bits, q_dtype=DataType.BF16, weights=w),
                 "fp32": dict(q=q32, weights=w),
                 "fp8": dict(q=codes, q_dtype=DataType.FP8_E4M3, weights=(w * s).astype(np.float32))}
        got = {}
        for name, kw in forms.items():
            with self.client.step([(sid, n, True)]) as step:
                got[name] = np.sort(step.run_layer(0, k=entries, **kw).topk, axis=1)
        np.testing.assert_array_equal(got["bf16"], got["fp32"])
        np.testing.assert_array_equal(got["fp8"], got["fp32"])

    def test_exception_in_with_block_aborts_and_rolls_back(self):
        wl = Workload(self.info, seed=11)
        sid, new = fresh_ids(2)
        self.run_step(wl, [(sid, 20)], create=True)
        seqs = self.client.server_info().sequences
        with self.assertRaisesRegex(RuntimeError, "front-end failed"):
            with self.client.step([(sid, 2), (new, 9, True)]) as s:
                for layer in wl.layers[:3]:
                    args, _ = wl.layer_inputs(layer, [(sid, 2), (new, 9)])
                    s.run_layer(layer.layer, **args)
                raise RuntimeError("front-end failed")
        self.assertFalse(s.is_open)
        info = self.client.server_info()
        self.assertEqual((info.sequences, info.open_steps), (seqs, 0))
        # Leaving the block without commit() also aborts.
        with self.client.step([(sid, 1)]) as s:
            args, _ = wl.layer_inputs(wl.layers[0], [(sid, 1)])
            s.run_layer(0, **args)
        with self.assertRaises(ic.StepClosedError):
            s.commit()
        # The sequence is still 20 tokens long: the next step's rows see 21.
        self.run_step(wl, [(sid, 1)], create=False)
        self.assertEqual(wl.seq_len[sid], 21)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.release([new])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_write_entries_then_decode(self):
        # Imports 200 tokens (FP8 layers pre-quantized, so the reference
        # knows them; the others FP32), then decode steps of every layer.
        sid = fresh_ids(1)[0]
        wl = Workload(self.info, seed=5)
        tokens = 200
        layers = {}
        for layer in wl.layers:
            g = wl.group(layer)
            n = reference.new_entries(0, tokens, g.compress_ratio)
            k = wl.rng.standard_normal((n, g.head_dim), dtype=np.float32)
            if g.kv_format == "fp8":
                k = fp8.quantize_k(k, g.ue8m0)
                wl.fp8_k[(sid, layer.layer)] = [fp8.decode_k(k, g.head_dim)]
            layers[layer.layer] = k
        self.assertEqual(self.client.write_entries(sid, tokens, layers, create=True), tokens)
        wl.seq_len[sid] = tokens
        self.run_step(wl, [(sid, 1)], create=False)
        self.run_step(wl, [(sid, 2)], create=False)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.write_entries(sid, 1, layers, create=True)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.ALREADY_EXISTS)

    def test_release_returns_pages(self):
        wl = Workload(self.info, seed=12)
        ids = fresh_ids(2)
        self.run_step(wl, [(ids[0], 100), (ids[1], 3)], create=True)
        info = self.client.server_info()
        self.assertGreater(self.client.release(ids), 0)
        after = self.client.server_info()
        self.assertEqual(after.sequences, info.sequences - 2)
        self.assertEqual(sum(g.free_pages for g in after.groups)
                         - sum(g.free_pages for g in info.groups) > 0, True)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.release([ids[0]])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)

    def test_bad_input_is_invalid_argument_naming_the_field(self):
        wl = Workload(self.info, seed=13)
        sid = fresh_ids(1)[0]
        self.run_step(wl, [(sid, 4)], create=True)
        layer = wl.layers[0]
        args, _ = wl.layer_inputs(layer, [(sid, 1)])
        args["weights"] = args["weights"][:, :15]  # H - 1 heads
        with self.client.step([(sid, 1)]) as s:
            with self.assertRaises(grpc.RpcError) as cm:
                s.run_layer(0, **args)
            self.assertFalse(s.is_open)
            with self.assertRaises(ic.StepClosedError):
                s.run_layer(1)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("weights", cm.exception.details())
        self.assertIn("expected [1, 16]", cm.exception.details())
        # Nothing changed: the next step appends to 4 tokens.
        self.run_step(wl, [(sid, 1)], create=False)
        self.assertEqual(wl.seq_len[sid], 5)
        # A q_len of 0 in the header surfaces at the first layer.
        with self.client.step([(sid, 0)]) as s:
            with self.assertRaises(grpc.RpcError) as cm:
                s.run_layer(0, **args)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("q_len", cm.exception.details())


class MetadataTest(unittest.TestCase):
    def test_client_id_is_sent_as_x_indexer_client(self):
        # An in-process stand-in for the daemon answers GetServerInfo with
        # the metadata it received.
        from concurrent import futures
        from indexer_client._pb import indexer_pb2_grpc as pb_grpc

        class Echo(pb_grpc.IndexerServicer):
            def GetServerInfo(self, request, context):
                md = dict(context.invocation_metadata())
                return ic.pb.ServerInfo(profile=md.get(ic.CLIENT_ID_HEADER, "<none>"),
                                        build=md.get("traceparent", "<none>"))

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_IndexerServicer_to_server(Echo(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            with ic.Client(f"127.0.0.1:{port}", client_id="fe-7") as c:
                self.assertEqual(c.server_info().profile, "fe-7")
            with ic.Client(f"127.0.0.1:{port}") as c:
                self.assertEqual(c.server_info().profile, "<none>")
            tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            with ic.Client(f"127.0.0.1:{port}", client_id="fe-8",
                           metadata=[("traceparent", tp)]) as c:
                info = c.server_info()
                self.assertEqual((info.profile, info.build), ("fe-8", tp))
        finally:
            server.stop(None)


def _host_transport(region):
    """A run_step transport that sends every input of a layer by reference
    to `region` (packed by its arena) and has the top-k written there."""
    def send(step, layer, args):
        region.arena.reset()
        kw = {}
        for field, dtype in (("k", None), ("q", args.get("q_dtype")), ("weights", None)):
            if field in args:
                a = args[field]
                wire = {np.dtype(np.float32): DataType.FP32, np.dtype(np.uint8): DataType.UINT8}
                kw[field] = region.put(a, dtype if dtype is not None else wire[a.dtype])
        rows = args["q"].shape[0]
        shape = ((layer.num_heads, rows, layer.topk_blocks) if layer.role == "block"
                 else (rows, layer.topk))
        out_ref, out = region.output(DataType.INT32, shape)
        out[...] = -7  # the daemon must overwrite every slot
        res = step.run_layer(layer.layer, topk_out=out_ref, **kw)
        if res.topk is not None or res.shape != shape:
            raise AssertionError(f"layer {layer.layer}: reply {res.shape} with "
                                 f"{'bytes' if res.topk is not None else 'no bytes'}")
        return res, out.copy()
    return send


class HostRegionTest(ClientTestBase):
    """Tensors by reference to a shared-memory region (SPEC §6 data plane).
    They run when the daemon lists the feature "host_regions"."""

    def setUp(self):
        super().setUp()
        if "host_regions" not in self.info.features:
            self.skipTest("the daemon does not list the feature host_regions")
        self.region = ic.HostRegion(self.client, 1 << 22, name="py-test-host")
        self.addCleanup(self.region.close)

    def test_every_layer_by_reference_against_reference(self):
        listed = {r.region: r for r in self.client.list_regions()}
        self.assertIn(self.region.region, listed)
        mine = listed[self.region.region]
        self.assertEqual((mine.name, mine.kind, mine.bytes, mine.where),
                         ("py-test-host", "host", 1 << 22, self.region.shm_name))
        wl = Workload(self.info, seed=21)
        ids = fresh_ids(2)
        send = _host_transport(self.region)
        self.run_step(wl, [(ids[0], 90), (ids[1], 7)], create=True, transport=send)
        for q_lens in ([1, 2], [2, 1]):
            self.run_step(wl, list(zip(ids, q_lens)), create=False, transport=send)
        self.assertEqual([wl.seq_len[i] for i in ids], [93, 10])

    def test_unregistered_region_is_not_found_and_changes_nothing(self):
        wl = Workload(self.info, seed=22)
        sid = fresh_ids(1)[0]
        self.run_step(wl, [(sid, 5)], create=True)
        args, _ = wl.layer_inputs(wl.layers[0], [(sid, 1)])
        q_ref = self.region.put(args["q"], DataType.FP8_E4M3)
        self.region.unregister()
        self.assertNotIn(q_ref.ref.region, [r.region for r in self.client.list_regions()])
        with self.client.step([(sid, 1)]) as s:
            with self.assertRaises(grpc.RpcError) as cm:
                s.run_layer(0, k=args["k"], q=q_ref, weights=args["weights"])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("region", cm.exception.details())
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.unregister_region(q_ref.ref.region)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.run_step(wl, [(sid, 1)], create=False)
        self.assertEqual(wl.seq_len[sid], 6)

    def test_bad_references_are_invalid_argument(self):
        wl = Workload(self.info, seed=23)
        sid = fresh_ids(1)[0]
        self.run_step(wl, [(sid, 5)], create=True)
        args, _ = wl.layer_inputs(wl.layers[0], [(sid, 1)])
        q_ref = self.region.put(args["q"], DataType.FP8_E4M3)
        cases = {
            "misaligned offset": dict(offset=q_ref.ref.offset + 8, bytes=q_ref.ref.bytes),
            "beyond the region": dict(offset=(1 << 22) - 1024, bytes=q_ref.ref.bytes),
            "bytes != shape x dtype": dict(offset=q_ref.ref.offset, bytes=q_ref.ref.bytes - 16),
        }
        for what, ref in cases.items():
            bad = ic.pb.Tensor(dtype=q_ref.dtype, shape=q_ref.shape,
                               ref=ic.pb.TensorRef(region=self.region.region, **ref))
            with self.subTest(what), self.client.step([(sid, 1)]) as s:
                with self.assertRaises(grpc.RpcError) as cm:
                    s.run_layer(0, k=args["k"], q=bad, weights=args["weights"])
                self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
                self.assertIn("q", cm.exception.details())
        # Both inline bytes and a reference: INVALID_ARGUMENT too.
        both = ic.pb.Tensor()
        both.CopyFrom(q_ref)
        both.data = b"\0" * q_ref.ref.bytes
        with self.client.step([(sid, 1)]) as s:
            with self.assertRaises(grpc.RpcError) as cm:
                s.run_layer(0, k=args["k"], q=both, weights=args["weights"])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
        self.run_step(wl, [(sid, 1)], create=False)
        self.assertEqual(wl.seq_len[sid], 6)

    def test_missing_shared_memory_object_is_not_found(self):
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.register_host_region("py-missing", "/idx-does-not-exist-7f3a", 4096)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("shm_name", cm.exception.details())


class MemfdRegionTest(ClientTestBase):
    """Host regions by memfd (os.memfd_create passed with socket.send_fds
    over the daemon's memfd socket). They run when the daemon lists the
    feature "host_regions_memfd"."""

    def setUp(self):
        super().setUp()
        if "host_regions_memfd" not in self.info.features:
            self.skipTest("the daemon does not list the feature host_regions_memfd")
        self.assertEqual(self.info.memfd_socket, _daemon.memfd_socket)

    def memfd(self, nbytes, sealable=True):
        flags = os.MFD_CLOEXEC | (os.MFD_ALLOW_SEALING if sealable else 0)
        fd = os.memfd_create("py-test", flags)
        self.addCleanup(os.close, fd)
        os.ftruncate(fd, nbytes)
        return fd

    def test_every_layer_by_reference_matches_shm_and_reference(self):
        """The same workload (same seed) through a memfd region and a
        shared-memory region: each checked against the reference, and the
        top-k of both identical."""
        results = []
        for make in (lambda: ic.MemfdRegion(self.client, 1 << 24, name="py-test-memfd"),
                     lambda: ic.HostRegion(self.client, 1 << 24, name="py-test-shm")):
            region = make()
            self.addCleanup(region.close)
            wl = Workload(self.info, seed=31)
            ids = fresh_ids(16)
            send = _host_transport(region)
            topk = []

            def keep(step, layer, args, send=send, topk=topk):
                res, out = send(step, layer, args)
                topk.append(out)
                return res, out

            self.run_step(wl, [(i, 8 + 5 * n) for n, i in enumerate(ids)], create=True,
                          transport=keep)
            for q_len in (1, 2):
                self.run_step(wl, [(i, q_len) for i in ids], create=False, transport=keep)
            results.append(topk)
            if isinstance(region, ic.MemfdRegion):
                mine = {r.region: r for r in self.client.list_regions()}[region.region]
                self.assertEqual((mine.name, mine.kind, mine.bytes),
                                 ("py-test-memfd", "host", 1 << 24))
                self.assertTrue(mine.where.startswith(f"memfd:py-test-memfd (pid {os.getpid()})"),
                                mine.where)
            region.close()
        self.assertEqual(len(results[0]), len(results[1]))
        for a, b in zip(*results):
            np.testing.assert_array_equal(a, b)

    def test_bad_tokens_and_spans(self):
        cases = [
            ("0" * 32, 4096, 0, grpc.StatusCode.NOT_FOUND, "host.memfd_token: unknown token"),
            ("nope", 4096, 0, grpc.StatusCode.INVALID_ARGUMENT, "host.memfd_token: expected 32"),
        ]
        for token, n, off, code, text in cases:
            with self.subTest(token), self.assertRaises(grpc.RpcError) as cm:
                self.client.register_memfd_token("bad", token, n, offset=off)
            self.assertEqual(cm.exception.code(), code)
            self.assertIn(text, cm.exception.details())
        token = ic.send_memfd(_daemon.memfd_socket, self.memfd(4096))
        for n, off, text in ((8192, 0, "host.bytes: expected offset + bytes <= the memfd's size "
                                       "(4096 bytes"),
                             (16, 8192, "host.offset: expected < the memfd's size")):
            with self.subTest(n=n, off=off), self.assertRaises(grpc.RpcError) as cm:
                self.client.register_memfd_token("small", token, n, offset=off)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn(text, cm.exception.details())
        # Refusals change nothing: the token still registers, once.
        region, _ = self.client.register_memfd_token("ok", token, 4096)
        self.addCleanup(self.client.unregister_region, region)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.register_memfd_token("again", token, 4096)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.assertIn("already used", cm.exception.details())

    def test_socket_refuses_what_is_no_single_memfd(self):
        fd = self.memfd(4096)
        r, w = os.pipe()
        self.addCleanup(os.close, r)
        self.addCleanup(os.close, w)
        with self.assertRaisesRegex(ic.RegionError, "expected a memfd .memfd_create., got a pipe"):
            ic.send_memfd(_daemon.memfd_socket, r)
        with self.assertRaisesRegex(ic.RegionError, "can be sealed against shrinking"):
            ic.send_memfd(_daemon.memfd_socket, self.memfd(4096, sealable=False))

        def exchange(payload, fds):
            with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
                s.settimeout(10)
                s.connect(_daemon.memfd_socket)
                socket.send_fds(s, [payload], fds)
                reply = s.recv(1024).decode()
                self.assertEqual(s.recv(1024), b"")  # dropped after an error
                return reply

        self.assertEqual(exchange(ic.regions.MEMFD_HELLO, []),
                         "error fds: expected exactly one descriptor (SCM_RIGHTS), got 0")
        self.assertEqual(exchange(ic.regions.MEMFD_HELLO, [fd, fd]),
                         "error fds: expected exactly one descriptor (SCM_RIGHTS), got 2")
        self.assertTrue(exchange(b"garbage", [fd]).startswith("error message: expected the 16 "
                                                            "bytes"))
        # Still serving.
        with ic.MemfdRegion(self.client, 4096) as region:
            self.assertIn(region.region, [r.region for r in self.client.list_regions()])


class RegionsAbsentTest(ClientTestBase):
    def test_daemon_without_host_regions_answers_unimplemented(self):
        if "host_regions" in self.info.features:
            self.skipTest("the daemon implements host regions (HostRegionTest covers them)")
        with self.assertRaises(grpc.RpcError) as cm:
            ic.HostRegion(self.client, 4096)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNIMPLEMENTED)
