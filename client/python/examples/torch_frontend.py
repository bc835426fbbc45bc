#!/usr/bin/env python3
"""A torch front-end of indexerd: decode steps of every layer of the profile
with CUDA tensors shared through a device region (SPEC §6 data plane).

What it does, per run:
  1. creates --batch sequences and imports --context tokens of random K into
     each (WriteEntries; FP8 layers pre-quantized by the front-end, the
     others FP32);
  2. runs --steps decode steps (q_len 1): for every layer, in layer order, it
     writes the new K entries, Q (FP8 e4m3 codes with the per-(row, head)
     power-of-two scale folded into the weights, or FP32 with --q-fp32) and
     the head weights into one registered device region, synchronizes (the
     ordering contract: inputs complete when the request is sent), sends a
     LayerRequest of references with topk_out in the same region, and reads
     the top-k there after the reply;
  3. with --check, runs the very same steps inline against a second daemon
     (--cpu-addr, e.g. indexerd --device cpu) and compares each row's top-k
     as a set. Rows that differ are accepted only on FP8 layers, and only
     when the differing entries are a near tie (their SPEC §5 logits,
     computed here from the exact entries, lie within twice the daemon's
     per-path bound of each other: 2^-12 of the terms' magnitudes, the
     tensor-core paths' bound); on MXFP4 and block layers every row must
     agree exactly.

It ends with one line:  "verdict: PASS ..." or "verdict: FAIL ..." (exit 1).

Example (H200, daemons on gpu:0 and on the cpu):
  build/server/indexerd --profile demo --device gpu:0 --listen 127.0.0.1:50061 &
  build/server/indexerd --profile demo --device cpu --listen 127.0.0.1:50062 &
  PYTHONPATH=build/python python3 client/python/examples/torch_frontend.py \\
      --addr 127.0.0.1:50061 --cpu-addr 127.0.0.1:50062 --check \\
      --steps 10 --batch 8 --context 4096 --device 0

--transport host|inline sends the same tensors through a shared-memory
region or inline instead (the comparison and the verdict are the same).
"""

import argparse
import contextlib
import os
import sys
import time

import numpy as np
import torch

import indexer_client as ic
from indexer_client import DataType, fp8, reference

FP8_MAX = 448.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default="127.0.0.1:50061", help="daemon under test (host:port)")
    p.add_argument("--cpu-addr", default="", help="reference daemon for --check (host:port)")
    p.add_argument("--check", action="store_true",
                   help="run every step inline on --cpu-addr too and compare the top-k")
    p.add_argument("--steps", type=int, default=10, help="decode steps")
    p.add_argument("--batch", type=int, default=8, help="sequences")
    p.add_argument("--context", type=int, default=4096, help="tokens imported per sequence")
    p.add_argument("--device", type=int, default=0, help="CUDA device of the front-end's tensors")
    p.add_argument("--transport", choices=["device", "host", "inline"], default="device")
    p.add_argument("--q-fp32", action="store_true",
                   help="send FP32 Q on FP8 layers (the daemon quantizes it)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--client-id", default="torch-frontend")
    args = p.parse_args()
    if args.check and not args.cpu_addr:
        p.error("--check needs --cpu-addr")
    return args


# ------------------------------------------------------------ quantization --

def pow2_scale(a):
    """Smallest power of two s with a <= 448 * s (a > 0), exactly, as
    SPEC §3 defines the ue8m0 K scale and the Q scale."""
    m, e = torch.frexp(a)  # a = m * 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(a), torch.where(m <= 0.875, e - 9, e - 8))


def quantize_k_fp8(k, ue8m0):
    """[n, D] float32 CUDA K -> [n, D + 4] uint8 linear FP8 entries."""
    a = k.abs().amax(dim=1).clamp_min(1e-4)
    s = pow2_scale(a) if ue8m0 else a / FP8_MAX
    codes = (k / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return torch.cat([codes.view(torch.uint8), s[:, None].contiguous().view(torch.uint8)], dim=1)


def quantize_q_fp8(q):
    """[rows, H, D] float32 -> (e4m3 codes as uint8, [rows, H] scales)."""
    s = pow2_scale(q.abs().amax(dim=2).clamp_min(1e-10))
    codes = (q / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes.view(torch.uint8), s


# ------------------------------------------------------------------ layers --

class Layer:
    def __init__(self, info, group):
        self.id = info.layer
        self.role = info.role
        self.heads = info.num_heads
        self.d = group.head_dim
        self.r = group.compress_ratio
        self.fp8 = group.kv_format == "fp8"
        self.ue8m0 = group.ue8m0
        self.entry_bytes = group.entry_bytes
        self.block = info.role == "block"
        self.topk = info.topk_blocks if self.block else info.topk

    def topk_shape(self, rows):
        return (self.heads, rows, self.topk) if self.block else (rows, self.topk)

    def inputs(self, n_new, rows, gen, dev, q_fp32):
        """This layer's step inputs as CUDA tensors:
        {field: (tensor, wire dtype)}."""
        k = torch.randn(n_new, self.d, generator=gen, device=dev)
        q = torch.randn(rows, self.heads, self.d, generator=gen, device=dev)
        out = {}
        out["k"] = (quantize_k_fp8(k, self.ue8m0), DataType.UINT8) if self.fp8 else \
            (k, DataType.FP32)
        if self.block:
            out["q"] = (q, DataType.FP32)
            return out
        w = torch.rand(rows, self.heads, generator=gen, device=dev) * 2 - 1
        if self.fp8 and not q_fp32:
            codes, s = quantize_q_fp8(q)
            out["q"] = (codes, DataType.FP8_E4M3)
            w = w * s
        else:
            out["q"] = (q, DataType.FP32)
        out["weights"] = ((w * (self.d ** -0.5 * self.heads ** -0.5)).float().contiguous(),
                          DataType.FP32)
        return out


# --------------------------------------------------------------- transport --

class DeviceTransport:
    """Every input by reference to one device region, top-k written there."""

    def __init__(self, client, nbytes, dev):
        self.region = ic.DeviceRegion(client, nbytes, device=dev, name="torch-frontend")

    def send(self, session, layer, inputs, rows):
        self.region.arena.reset()
        refs = {}
        for field, (t, dtype) in inputs.items():
            raw = t.contiguous().view(-1).view(torch.uint8)
            off = self.region.arena.alloc(raw.numel())
            self.region.view(off, torch.uint8, (raw.numel(),)).copy_(raw)
            refs[field] = self.region.ref(dtype, tuple(t.shape), off)
        shape = layer.topk_shape(rows)
        off = self.region.arena.alloc(int(np.prod(shape)) * 4)
        torch.cuda.synchronize()  # inputs complete before the request is sent
        res = session.run_layer(layer.id, topk_out=self.region.out_ref(DataType.INT32, shape, off),
                                **refs)
        return res, self.region.view(off, torch.int32, shape).cpu().numpy()

    def close(self):
        self.region.close()


class HostTransport:
    def __init__(self, client, nbytes):
        self.region = ic.HostRegion(client, nbytes, name="torch-frontend")

    def send(self, session, layer, host_inputs, rows):
        self.region.arena.reset()
        refs = {f: self.region.put(a, dtype) for f, (a, dtype) in host_inputs.items()}
        out_ref, out = self.region.output(DataType.INT32, layer.topk_shape(rows))
        res = session.run_layer(layer.id, topk_out=out_ref, **refs)
        return res, out.copy()

    def close(self):
        self.region.close()


def inline_send(session, layer, host_inputs):
    kw = {f: ic.to_tensor(a, dtype, what=f"layer {layer.id}: {f}")
          for f, (a, dtype) in host_inputs.items()}
    return session.run_layer(layer.id, **kw)


def to_host(inputs):
    """CUDA inputs -> numpy carriers of their wire dtypes."""
    return {f: (t.cpu().numpy(), dtype) for f, (t, dtype) in inputs.items()}


# ------------------------------------------------------------------ checks --

class Checker:
    """Compares the daemon's top-k with the reference daemon's, row by row.

    Keeps the FP8 layers' entries (132 bytes each at D = 128) so that rows
    whose sets differ can be judged: a difference is a near tie when the
    entries only one side chose all score within the tolerance of each
    other (SPEC §5's tie rule applied to both answers at once)."""

    def __init__(self):
        self.entries = {}  # (seq index, layer) -> list of uint8 [n, D + 4]
        self.rows = self.identical = self.ties = 0
        self.bad = []

    def keep(self, layer, n_new, k_host):
        if not layer.fp8:
            return
        at = 0
        for i, n in enumerate(n_new):
            self.entries.setdefault((i, layer.id), []).append(k_host[at:at + n])
            at += n

    def compare(self, step, layer, got, want, host_inputs):
        if got.shape != want.shape:
            self.bad.append(f"step {step} layer {layer.id}: shape {got.shape} vs {want.shape}")
            return
        flat_got = got.reshape(-1, got.shape[-1])
        flat_want = want.reshape(-1, want.shape[-1])
        for row, (g, w) in enumerate(zip(flat_got, flat_want)):
            self.rows += 1
            gs, ws = set(g.tolist()), set(w.tolist())
            if gs == ws:
                self.identical += 1
                continue
            if layer.fp8 and not layer.block and self.near_tie(layer, row, gs ^ ws, gs | ws,
                                                                host_inputs):
                self.ties += 1
                continue
            self.bad.append(f"step {step} layer {layer.id} row {row}: "
                            f"{len(gs - ws)} entries differ")

    def near_tie(self, layer, row, differ, union, host_inputs):
        if -1 in differ:
            return False  # different counts: never a tie
        k = np.concatenate(self.entries[(row, layer.id)])  # decode: row i = sequence i
        vals, scales = fp8.decode_k(k, layer.d)
        q, q_dtype = host_inputs["q"]
        w = host_inputs["weights"][0][row]
        if q_dtype == DataType.FP8_E4M3:
            qv = fp8.decode_e4m3(q[row])
        else:
            # FP32 Q: both daemons quantize it by SPEC §3, as fp8.quantize_q
            # does bit for bit, and fold the scale into the weights.
            codes, s = fp8.quantize_q(q[row:row + 1])
            qv, w = fp8.decode_e4m3(codes[0]), (w * s[0]).astype(np.float32)
        d = np.array(sorted(differ))
        spread = np.ptp(reference.dense_fp8_logits(qv, w, vals[d], scales[d]))
        # The daemon's bound for its path (the tests' per-path tolerances):
        # fp32 paths sum within 2^-16 of the terms' magnitudes, tensor-core
        # paths (which H 16/32/64 FP8 layers take on sm_90) within 2^-12.
        # The magnitudes: the same sum over absolute values.
        mag = reference.dense_fp8_logits(np.abs(qv), np.abs(w), np.abs(vals[d]), scales[d])
        return spread <= 2.0 ** -12 * 2 * mag.max() + 1e-30


# -------------------------------------------------------------------- main --

def import_context(clients, info, layers, ids, tokens, gen, dev, checker):
    """WriteEntries of `tokens` tokens per sequence, in chunks under the
    message limit, identical on every client."""
    if tokens == 0:
        return
    per_token = sum(l.d * 4 / l.r for l in layers.values())
    chunk = max(1, int(min(info.max_message_bytes // 2, 64 << 20) // per_token))
    for i, sid in enumerate(ids):
        done = 0
        while done < tokens:
            n = min(chunk, tokens - done)
            entries = {}
            for l in layers.values():
                n_new = reference.new_entries(done, n, l.r)
                k = torch.randn(n_new, l.d, generator=gen, device=dev)
                host = (quantize_k_fp8(k, l.ue8m0) if l.fp8 else k).cpu().numpy()
                if checker:
                    checker.keep(l, [n_new if j == i else 0 for j in range(len(ids))], host)
                entries[l.id] = host
            for c in clients:
                c.write_entries(sid, n, entries, create=done == 0)
            done += n


def main():
    args = parse_args()
    dev = torch.device(f"cuda:{args.device}")
    torch.cuda.set_device(dev)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed)

    client = ic.Client(args.addr, client_id=args.client_id)
    info = client.server_info()
    groups = {g.name: g for g in info.groups}
    layers = {l.layer: Layer(l, groups[l.group]) for l in info.layers}
    ref_client = None
    if args.check:
        ref_client = ic.Client(args.cpu_addr, client_id=args.client_id)
        ref_info = ref_client.server_info()
        if ref_info.profile != info.profile:
            sys.exit(f"--cpu-addr serves profile {ref_info.profile}, --addr {info.profile}")
    print(f"daemon: {info.device}, profile {info.profile}, {len(layers)} layers; "
          f"transport {args.transport}" + (f"; reference: {ref_info.device}" if ref_client else ""))

    ids = [f"torch-fe-{os.getpid()}-{i}" for i in range(args.batch)]
    checker = Checker() if args.check else None
    clients = [client] + ([ref_client] if ref_client else [])
    import_context(clients, info, layers, ids, args.context, gen, dev, checker)

    # One region sized for the largest layer of a decode step (q_len 1).
    rows = args.batch
    need = 0
    for l in layers.values():
        n_new = args.batch  # at most one entry per sequence and layer at q_len 1
        sizes = [n_new * (l.entry_bytes if l.fp8 else l.d * 4), rows * l.heads * l.d * 4,
                 rows * l.heads * 4, int(np.prod(l.topk_shape(rows))) * 4]
        need = max(need, ic.packed_size(*sizes))
    transport = None
    if args.transport == "device":
        transport = DeviceTransport(client, need, args.device)
    elif args.transport == "host":
        transport = HostTransport(client, need)

    lengths = {sid: args.context for sid in ids}
    round_trip_us = []
    try:
        for step in range(args.steps):
            create = lengths[ids[0]] == 0
            header = [(sid, 1, create) for sid in ids]
            with contextlib.ExitStack() as stack:
                s = stack.enter_context(client.step(header, request_id=f"torch-fe-{step}"))
                ref = (stack.enter_context(ref_client.step(header, request_id=f"torch-fe-{step}"))
                       if ref_client else None)
                for lid in sorted(layers):
                    l = layers[lid]
                    n_new = [reference.new_entries(lengths[sid], 1, l.r) for sid in ids]
                    inputs = l.inputs(sum(n_new), rows, gen, dev, args.q_fp32)
                    host = to_host(inputs) if (ref or args.transport != "device") else None
                    t0 = time.perf_counter()
                    if args.transport == "device":
                        res, got = transport.send(s, l, inputs, rows)
                    elif args.transport == "host":
                        res, got = transport.send(s, l, host, rows)
                    else:
                        res = inline_send(s, l, host)
                        got = res.topk
                    round_trip_us.append((time.perf_counter() - t0) * 1e6)
                    if ref:
                        want = inline_send(ref, l, host).topk
                        checker.keep(l, n_new, host["k"][0])
                        checker.compare(step, l, got, want, host)
                got_lens = s.commit()
                if ref:
                    want_lens = ref.commit()
                    if got_lens != want_lens:
                        checker.bad.append(f"step {step}: lengths {got_lens} vs {want_lens}")
            for sid in ids:
                lengths[sid] += 1
            if got_lens != [lengths[sid] for sid in ids]:
                sys.exit(f"step {step}: committed lengths {got_lens}, expected "
                         f"{[lengths[sid] for sid in ids]}")
    finally:
        if transport:
            transport.close()
        for c in clients:
            try:
                c.release(ids)
            except Exception as e:  # report, keep going: the verdict matters more
                print(f"release on {c.addr}: {e}")

    rt = np.array(round_trip_us)
    print(f"layer round trip ({args.transport}): p50 {np.percentile(rt, 50):.0f} us, "
          f"p99 {np.percentile(rt, 99):.0f} us over {rt.size} layers")
    if not checker:
        print(f"verdict: RAN {args.steps} steps x {len(layers)} layers x batch {args.batch}, "
              "no --check")
        return 0
    for line in checker.bad[:10]:
        print("  " + line)
    ok = not checker.bad
    print(f"verdict: {'PASS' if ok else 'FAIL'} {checker.rows - len(checker.bad)}/{checker.rows} "
          f"rows agree with {args.cpu_addr} ({checker.identical} identical, {checker.ties} near "
          f"ties); {args.steps} steps x {len(layers)} layers x batch {args.batch}, "
          f"context {args.context}, transport {args.transport}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
