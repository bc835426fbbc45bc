"""The Python request-ring client (indexer_client.ring) against indexerd on
the cpu backend (demo profile): steps over the ring agree with the
reference and with the Step stream on the same sequences; an error answer
rolls the step back and the ring takes the next one; an exception in the
with block aborts; close() detaches and releases everything.

Run: PYTHONPATH=build/python INDEXERD=build/server/indexerd \
       python3 -m unittest -v test_ring   (from client/python/tests)
ctest runs it within python_client_test.
"""

import itertools
import unittest

import grpc
import numpy as np

import indexer_client as ic
from indexer_client import DataType
from daemon import Daemon
from workload import Workload

_daemon = None
_ids = itertools.count(5000)


def setUpModule():
    global _daemon
    _daemon = Daemon("demo")


def tearDownModule():
    if _daemon is not None:
        _daemon.stop()


_WIRE = {np.dtype(np.float32): DataType.FP32, np.dtype(np.uint8): DataType.UINT8}


class RingTest(unittest.TestCase):
    memfd = False  # MemfdRingTest: the ring and its data in memfd regions

    def setUp(self):
        self.client = ic.Client(_daemon.addr, client_id="py-ring", timeout=120)
        self.addCleanup(self.client.close)
        self.info = self.client.server_info()
        if "host_ring" not in self.info.features:
            self.skipTest("the daemon does not list the feature host_ring")
        if self.memfd and "host_regions_memfd" not in self.info.features:
            self.skipTest("the daemon does not list the feature host_regions_memfd")
        self.ring = ic.Ring(self.client, slot_count=4, slot_bytes=64 << 10, data_bytes=4 << 20,
                            memfd=self.memfd)
        self.addCleanup(self.ring.close)

    def ring_step(self, wl, batch, create, inline=False, stream=False):
        """One committed step over every layer, through the ring (tensors in
        ring.data, the top-k through topk_out; `inline`: in the messages) or
        `stream`: the Step stream; every layer checked."""
        sent = []
        seqs = [(s, q, create) for s, q in batch]
        with (self.client.step(seqs) if stream else self.ring.step(seqs)) as step:
            for layer in wl.layers:
                args, n_new = wl.layer_inputs(layer, batch)
                if inline or stream:
                    res = step.run_layer(layer.layer, **args)
                    topk = res.topk
                else:
                    data = self.ring.data
                    data.arena.reset()
                    kw = {}
                    for field in ("k", "q", "weights"):
                        if field in args:
                            a = args[field]
                            dtype = args["q_dtype"] if field == "q" and "q_dtype" in args \
                                else _WIRE[a.dtype]
                            kw[field] = data.put(a, dtype)
                    rows = args["q"].shape[0]
                    shape = ((layer.num_heads, rows, layer.topk_blocks) if layer.role == "block"
                             else (rows, layer.topk))
                    out_ref, out = data.output(DataType.INT32, shape)
                    out[...] = -7  # the daemon must overwrite every slot
                    res = step.run_layer(layer.layer, topk_out=out_ref, **kw)
                    self.assertIsNone(res.topk)
                    self.assertEqual(res.shape, shape)
                    topk = out.copy()
                sent.append((layer, args, n_new, topk))
            lengths = step.commit()
        for layer, args, n_new, _ in sent:
            wl.record(layer, batch, args, n_new)
        self.assertEqual(lengths, wl.commit_lengths(batch))
        for layer, args, _, topk in sent:
            problems = wl.check(layer, batch, args, topk)
            self.assertEqual(problems, [], f"layer {layer.layer} ({layer.role}): "
                             + "; ".join(problems[:5]))

    def test_steps_agree_with_the_reference_and_the_stream(self):
        wl = Workload(self.info, seed=31)
        ids = [next(_ids) for _ in range(3)]
        self.ring_step(wl, [(ids[0], 70), (ids[1], 5), (ids[2], 1)], create=True)
        for i in range(4):
            batch = list(zip(ids, [1, 2, 1] if i % 2 else [2, 1, 1]))
            self.ring_step(wl, batch, create=False, inline=i == 1, stream=i == 2)
        self.assertEqual([wl.seq_len[i] for i in ids], [76, 11, 5])
        self.client.release(ids)

    def test_an_error_rolls_back_and_the_ring_takes_the_next_step(self):
        wl = Workload(self.info, seed=32)
        sid = next(_ids)
        self.ring_step(wl, [(sid, 9)], create=True)
        step = self.ring.step([(sid, 1)])
        args, _ = wl.layer_inputs(wl.layers[0], [(sid, 1)])
        with self.assertRaises(ic.RingError) as cm:
            step.run_layer(99, **args)
        self.assertEqual(cm.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertIn("layer 99", str(cm.exception))
        self.assertFalse(step.is_open)
        # A header naming a missing sequence: its error surfaces at the layer.
        step = self.ring.step([(next(_ids), 1, False)])
        with self.assertRaises(ic.RingError) as cm:
            step.run_layer(0, **args)
        self.assertEqual(cm.exception.code, grpc.StatusCode.NOT_FOUND)
        self.assertEqual(self.client.server_info().open_steps, 0)
        self.ring_step(wl, [(sid, 1)], create=False)
        self.assertEqual(wl.seq_len[sid], 10)
        self.client.release([sid])

    def test_exception_in_with_block_aborts_and_rolls_back(self):
        wl = Workload(self.info, seed=33)
        sid, new = next(_ids), next(_ids)
        self.ring_step(wl, [(sid, 20)], create=True)
        seqs = self.client.server_info().sequences
        with self.assertRaisesRegex(RuntimeError, "front-end failed"):
            with self.ring.step([(sid, 2), (new, 9, True)]) as s:
                for layer in wl.layers[:2]:
                    args, _ = wl.layer_inputs(layer, [(sid, 2), (new, 9)])
                    s.run_layer(layer.layer, **args)
                raise RuntimeError("front-end failed")
        self.assertFalse(s.is_open)
        info = self.client.server_info()
        self.assertEqual((info.sequences, info.open_steps), (seqs, 0))
        self.ring_step(wl, [(sid, 1)], create=False)
        self.assertEqual(wl.seq_len[sid], 21)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.release([new])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        self.client.release([sid])

    def test_close_detaches_and_releases_the_regions(self):
        mine = {r.region for r in self.client.list_regions()}
        self.assertIn(self.ring.region, mine)
        self.assertIn(self.ring.data.region, mine)
        wl = Workload(self.info, seed=34)
        sid = next(_ids)
        step = self.ring.step([(sid, 3, True)])
        args, _ = wl.layer_inputs(wl.layers[0], [(sid, 3)])
        step.run_layer(0, **args)
        # Closing with a step open: the daemon rolls it back.
        self.ring.close()
        self.assertEqual(self.client.list_regions(), [])
        info = self.client.server_info()
        self.assertEqual(info.open_steps, 0)
        with self.assertRaises(grpc.RpcError) as cm:
            self.client.release([sid])
        self.assertEqual(cm.exception.code(), grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(ic.StepClosedError):
            step.run_layer(0, **args)

    def test_bad_ring_parameters_are_refused_before_anything_is_sent(self):
        for kw in (dict(slot_count=3), dict(slot_count=2048), dict(slot_bytes=1000),
                   dict(slot_bytes=512)):
            with self.assertRaises(ic.RegionError):
                ic.Ring(self.client, **kw)


class MemfdRingTest(RingTest):
    """The same cases with the ring and its tensors in memfd regions (the
    descriptors passed over the daemon's memfd socket)."""
    memfd = True

    def test_the_regions_are_memfds(self):
        listed = {r.region: r for r in self.client.list_regions()}
        for region in (self.ring.region, self.ring.data.region):
            self.assertTrue(listed[region].where.startswith("memfd:"), listed[region].where)


if __name__ == "__main__":
    unittest.main()
