#!/usr/bin/python3
"""Cache sizing of indexerd profiles: pages and bytes per group, per token
and per sequence at given context lengths, and how many sequences fit.

  docs/sizing.py [PROFILE.textproto ...] [--context 8192,32768,131072] [--cache-mb N]

Default: every profile in deploy/configs. The arithmetic is the daemon's
(server/core/model.cc, kernels/format/page_layout.h): an entry is VB + SB
bytes (FP8: D + 4; MXFP4: D/2 + D/32), a page E entries; groups without an
explicit `pages` share what is left of cache_mb, the same page count for
each of their layers; a sequence of L tokens holds L // r entries per layer,
ceil((L // r) / E) pages. `indexerd --check-config` prints the resolved
geometry of one profile from the daemon itself.
"""
import argparse
import glob
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_config_module():
    out = tempfile.mkdtemp()
    subprocess.run(["protoc", f"-I{ROOT}/server/config", f"--python_out={out}",
                    f"{ROOT}/server/config/config.proto"], check=True)
    sys.path.insert(0, out)
    import config_pb2  # noqa: E402  (generated above)
    return config_pb2


def mib(b):
    return b / 2**20


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("profiles", nargs="*")
    ap.add_argument("--context", default="8192,32768,131072")
    ap.add_argument("--cache-mb", type=int, default=0, help="override the profile's cache_mb")
    opts = ap.parse_args()
    from google.protobuf import text_format
    pb = load_config_module()
    contexts = [int(x) for x in opts.context.split(",")]
    paths = opts.profiles or sorted(glob.glob(f"{ROOT}/deploy/configs/*.textproto"))
    for path in paths:
        cfg = text_format.Parse(open(path).read(), pb.ServerConfig())
        cache_mb = opts.cache_mb or cfg.cache_mb or 2048
        groups = []
        for g in cfg.groups:
            d = g.head_dim
            vb, sb = (d, 4) if g.kv_format == "fp8" else (d // 2, d // 32)
            e = g.page_entries
            r = g.compress_ratio or 1
            layers = sum(x.end - x.begin for x in g.layers)
            groups.append(dict(name=g.name, fmt=g.kv_format, entry=vb + sb, E=e, r=r,
                               layers=layers, page=e * (vb + sb), pages=g.pages))
        budget = cache_mb << 20
        shared = 0
        for g in groups:
            if g["pages"]:
                budget -= g["pages"] * g["page"] * g["layers"]
            else:
                shared += g["page"] * g["layers"]
        for g in groups:
            if not g["pages"]:
                g["pages"] = budget // shared
        print(f"## {cfg.profile} (cache_mb {cache_mb})\n")
        print("| group | format | layers | entry B | E | r | page B | pages per layer | "
              "bytes per token (all layers) |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for g in groups:
            per_token = g["entry"] * g["layers"] / g["r"]
            print(f"| {g['name']} | {g['fmt']} | {g['layers']} | {g['entry']} | {g['E']} | "
                  f"{g['r']} | {g['page']} | {g['pages']:,} | {per_token:,.0f} |")
        print()
        print("| context (tokens) | pages per layer per sequence | MiB per sequence | "
              "sequences that fit |")
        print("| ---: | --- | ---: | ---: |")
        for L in contexts:
            need = []
            total = 0
            fit = None
            for g in groups:
                entries = L // g["r"]
                p = -(-entries // g["E"])
                need.append(f"{g['name']} {p:,}")
                total += p * g["page"] * g["layers"]
                f = g["pages"] // p if p else None
                fit = f if fit is None or (f is not None and f < fit) else fit
            print(f"| {L:,} | {', '.join(need)} | {mib(total):,.1f} | "
                  f"{fit if fit is not None else 'any'} |")
        print()


if __name__ == "__main__":
    main()
