"""Random step inputs for every layer of a profile, and the checks of the
replies: the FP8 dense layers (dense and candidate-source roles) against
the numpy reference of SPEC §5, every other layer by the structure SPEC §5
fixes (count, range, distinct, forced blocks).

FP8 layers get pre-quantized K entries and FP8 Q built with
indexer_client.fp8, so the reference sees exactly the values the daemon
stores; the other layers get FP32 K and Q, quantized by the daemon.
"""

import numpy as np

from indexer_client import DataType, fp8, reference


class Workload:
    def __init__(self, info, seed):
        self.rng = np.random.default_rng(seed)
        self.groups = {g.name: g for g in info.groups}
        self.layers = sorted(info.layers, key=lambda l: l.layer)
        self.seq_len = {}  # id -> tokens held
        self.fp8_k = {}    # (id, layer) -> [(values [n, D], scales [n])]

    def group(self, layer):
        return self.groups[layer.group]

    def is_fp8_dense(self, layer):
        return (self.group(layer).kv_format == "fp8"
                and layer.role in ("dense", "candidate_source"))

    def layer_inputs(self, layer, batch):
        """Inputs of one layer for batch = [(id, q_len), ...]: a dict of
        run_layer keyword arguments plus the reference data."""
        g = self.group(layer)
        d, h, r = g.head_dim, layer.num_heads, g.compress_ratio
        rows = sum(q for _, q in batch)
        n_new = [reference.new_entries(self.seq_len.get(s, 0), q, r) for s, q in batch]
        k = self.rng.standard_normal((sum(n_new), d), dtype=np.float32)
        q = self.rng.standard_normal((rows, h, d), dtype=np.float32)
        args = {}
        if g.kv_format == "fp8":
            entries = fp8.quantize_k(k, g.ue8m0)
            codes, q_s = fp8.quantize_q(q)
            w = self.rng.uniform(-1, 1, (rows, h)).astype(np.float32)
            w = (w * q_s * np.float32(d ** -0.5 * h ** -0.5)).astype(np.float32)
            args = dict(k=entries, q=codes, q_dtype=DataType.FP8_E4M3, weights=w)
        elif layer.role == "block":
            args = dict(k=k, q=q)
        else:
            args = dict(k=k, q=q, weights=self.rng.uniform(-1, 1, (rows, h)).astype(np.float32))
        return args, n_new

    def record(self, layer, batch, args, n_new):
        """Keeps the decoded FP8 entries a layer appended (for the reference)."""
        if self.group(layer).kv_format != "fp8":
            return
        d = self.group(layer).head_dim
        at = 0
        for (s, _), n in zip(batch, n_new):
            self.fp8_k.setdefault((s, layer.layer), []).append(
                fp8.decode_k(args["k"][at:at + n], d))
            at += n

    def visible(self, layer, batch):
        """Per row: visible entries after the step (lengths already advanced)."""
        r = self.group(layer).compress_ratio
        return np.concatenate([reference.visible_entries(self.seq_len[s], q, r)
                               for s, q in batch])

    def check(self, layer, batch, args, topk):
        """Problems of a layer's top-k (empty = right). Call after the step's
        lengths were advanced (commit_lengths)."""
        g = self.group(layer)
        n_vis = self.visible(layer, batch)
        problems = []
        if layer.role == "block":
            e = g.page_entries
            want_shape = (layer.num_heads, len(n_vis), layer.topk_blocks)
            if topk.shape != want_shape:
                return [f"shape {topk.shape}, expected {want_shape}"]
            for hh in range(layer.num_heads):
                for row, n in enumerate(n_vis):
                    causal = -(-int(n) // e)
                    got = topk[hh, row]
                    want = min(layer.topk_blocks, causal)
                    ids = got[:want]
                    if (got[want:] != -1).any() or (ids < 0).any() or (ids >= causal).any() \
                            or np.unique(ids).size != want:
                        problems.append(f"head {hh} row {row}: {got.tolist()} for {causal} blocks")
                    forced = set(range(min(layer.init_blocks, causal)))
                    forced |= set(range(max(0, causal - layer.local_blocks), causal))
                    if not forced <= set(ids.tolist()):
                        problems.append(f"head {hh} row {row}: {got.tolist()} lacks {forced}")
            return problems
        if topk.shape != (len(n_vis), layer.topk):
            return [f"shape {topk.shape}, expected {(len(n_vis), layer.topk)}"]
        if not self.is_fp8_dense(layer):
            for row, n in enumerate(n_vis):
                # Candidate consumers return min(topk, pool entries); the demo
                # pool (24 blocks of 8) holds every entry of a row with fewer
                # than 64, so both roles fill min(topk, n) slots.
                want = min(layer.topk, int(n))
                got = topk[row]
                ids = got[:want]
                if (got[want:] != -1).any() or (ids < 0).any() or (ids >= n).any() \
                        or np.unique(ids).size != want:
                    problems.append(f"row {row}: {got.tolist()} for {n} entries")
            return problems
        q_vals = fp8.decode_e4m3(args["q"])
        row = 0
        for s, q_len in batch:
            parts = self.fp8_k[(s, layer.layer)]
            k_vals = np.concatenate([p[0] for p in parts])
            k_scales = np.concatenate([p[1] for p in parts])
            for _ in range(q_len):
                n = int(n_vis[row])
                logits = reference.dense_fp8_logits(q_vals[row], args["weights"][row],
                                                    k_vals[:n], k_scales[:n])
                for p in reference.check_topk_row(logits, topk[row], layer.topk):
                    problems.append(f"seq {s} row {row}: {p}")
                row += 1
        return problems

    def commit_lengths(self, batch):
        for s, q in batch:
            self.seq_len[s] = self.seq_len.get(s, 0) + q
        return [self.seq_len[s] for s, _ in batch]
