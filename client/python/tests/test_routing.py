"""Several daemons behind one client: rendezvous hashing (adding a daemon
moves ~1/n of the sequences, all to it; the C++ client's vectors), a batch
spread over three cpu daemons on loopback as one step per daemon (atomic
per daemon only), and the export/import hand-off between two of them."""

import unittest

import numpy as np

import indexer_client as ic
from daemon import Daemon
from workload import Workload

_daemons = []


def setUpModule():
    for _ in range(3):
        _daemons.append(Daemon("demo"))


def tearDownModule():
    for d in _daemons:
        d.stop()


class HashTest(unittest.TestCase):
    def test_adding_a_daemon_moves_about_one_nth_only_to_it(self):
        three = [f"indexer-{i}.indexer:50061" for i in range(3)]
        four = three + ["indexer-3.indexer:50061"]
        n, moved = 8000, 0
        for i in range(n):
            sid = f"chat-{i}" if i % 2 else i * 7919
            before, after = ic.pick_daemon(three, sid), ic.pick_daemon(four, sid)
            if before != after:
                moved += 1
                self.assertEqual(after, 3, "a sequence moved between two old daemons")
        self.assertLess(abs(moved - n / 4), 400)

    def test_same_daemon_as_the_cpp_client(self):
        d = ["10.0.0.1:50061", "10.0.0.2:50061", "10.0.0.3:50061"]
        got = [ic.pick_daemon(d, f"seq-{i}") for i in range(12)]
        got += [ic.pick_daemon(d, i) for i in range(4)]
        # tests/integration/routing_test.cc MatchesThePythonClient
        self.assertEqual(got, [0, 2, 2, 0, 0, 0, 2, 1, 0, 1, 0, 2, 0, 2, 1, 2])

    def test_bad_addresses(self):
        with self.assertRaisesRegex(ValueError, "addresses: expected at least one"):
            ic.RoutedClient([])
        with self.assertRaisesRegex(ValueError, r"addresses\[1\]"):
            ic.RoutedClient(["127.0.0.1:1", "127.0.0.1:1"])


class RoutedStepTest(unittest.TestCase):
    def setUp(self):
        self.rc = ic.RoutedClient([d.addr for d in _daemons], client_id=self.id())
        self.info = self.rc.clients[0].server_info()
        self.wl = Workload(self.info, seed=5)

    def tearDown(self):
        self.rc.close()

    def ids(self, prefix, per_daemon):
        """Ids that give every daemon per_daemon sequences (the daemons'
        ports, and so the routing, change from run to run)."""
        out, count, i = [], [0] * len(self.rc.addresses), 0
        while min(count) < per_daemon:
            s = f"{prefix}{i}"
            d = self.rc.daemon_for(s)
            if count[d] < per_daemon:
                out.append(s)
                count[d] += 1
            i += 1
        return out

    def routed_step(self, batch, create):
        """One routed step (create: one flag, or one per sequence); every
        committed part checked by the workload."""
        wl = self.wl
        sub = {}
        for i, (s, _) in enumerate(batch):
            sub.setdefault(self.rc.daemon_for(s), []).append(i)
        # Inputs made up front: build runs on the parts' threads.
        inputs = {d: {l.layer: wl.layer_inputs(l, [batch[i] for i in idx]) for l in wl.layers}
                  for d, idx in sub.items()}
        creates = create if isinstance(create, list) else [create] * len(batch)
        parts = self.rc.step([(s, q, c) for (s, q), c in zip(batch, creates)],
                             [l.layer for l in wl.layers],
                             lambda d, idx, layer: inputs[d][layer][0])
        for p in parts:
            if p.error is not None:
                continue
            part_batch = [batch[i] for i in p.sequences]
            for l in wl.layers:
                wl.record(l, part_batch, *inputs[p.daemon][l.layer])
            self.assertEqual(p.committed, wl.commit_lengths(part_batch))
            for l, res in zip(wl.layers, p.results):
                problems = wl.check(l, part_batch, inputs[p.daemon][l.layer][0], res.topk)
                self.assertEqual(problems, [], f"layer {l.layer}: " + "; ".join(problems[:3]))
        return parts

    def test_batch_spread_over_three_daemons(self):
        ids = self.ids("r", 4)
        parts = self.routed_step([(s, 20 + i) for i, s in enumerate(ids)], create=True)
        self.assertEqual([p.daemon for p in parts], [0, 1, 2])
        for p in parts:
            self.assertIsNone(p.error)
        for _ in range(2):
            for p in self.routed_step([(s, 1) for s in ids], create=False):
                self.assertIsNone(p.error)
        # Each daemon holds exactly its own sequences.
        for d, c in enumerate(self.rc.clients):
            listed, _ = c.list_sequences()
            self.assertEqual(sorted(s.id.name for s in listed),
                             sorted(s for s in ids if self.rc.daemon_for(s) == d))
            for s in listed:
                self.assertEqual(s.length, self.wl.seq_len[s.id.name])
        self.assertGreater(self.rc.release(ids), 0)
        for c in self.rc.clients:
            self.assertEqual(c.list_sequences()[0], [])

    def test_atomic_per_daemon_only(self):
        ids = self.ids("a", 3)
        for p in self.routed_step([(s, 16) for s in ids], create=True):
            self.assertIsNone(p.error)
        # ids[0] created again: its daemon refuses its part (ALREADY_EXISTS)
        # and rolls it back; the other daemons' parts commit.
        victim = self.rc.daemon_for(ids[0])
        parts = self.routed_step([(s, 1) for s in ids], create=[s == ids[0] for s in ids])
        self.assertEqual(len(parts), 3)
        for p in parts:
            if p.daemon == victim:
                self.assertEqual(p.error.code().name, "ALREADY_EXISTS")
            else:
                self.assertIsNone(p.error)
        for d, c in enumerate(self.rc.clients):
            for s in c.list_sequences()[0]:
                self.assertEqual(s.length, 16 if d == victim else 17, s.id.name)
        self.rc.release(ids)

    def test_hand_off_between_daemons(self):
        src, dst = self.rc.clients[0], self.rc.clients[1]
        wl = Workload(self.info, seed=9)
        batch = [("h", 150)]
        with src.step([("h", 150, True)]) as step:
            for l in wl.layers:
                args, n_new = wl.layer_inputs(l, batch)
                step.run_layer(l.layer, **args)
                wl.record(l, batch, args, n_new)
            step.commit()
        wl.commit_lengths(batch)
        n = 0
        for m in src.export_entries("h", max_message_bytes=64 << 10):
            self.assertLessEqual(m.ByteSize(), 64 << 10)
            self.assertEqual(m.create, n == 0)
            dst.write_entries_request(m)
            n += 1
        self.assertGreater(n, 1)
        # The same decode step on both: identical top-k on every layer.
        batch = [("h", 1)]
        inputs = {l.layer: wl.layer_inputs(l, batch) for l in wl.layers}
        got = []
        for c in (src, dst):
            with c.step([("h", 1, False)]) as step:
                got.append([step.run_layer(l.layer, **inputs[l.layer][0]).topk
                            for l in wl.layers])
                step.commit()
        for l, a, b in zip(wl.layers, got[0], got[1]):
            np.testing.assert_array_equal(a, b, f"layer {l.layer}")
        src.release(["h"])
        dst.release(["h"])


if __name__ == "__main__":
    unittest.main()
