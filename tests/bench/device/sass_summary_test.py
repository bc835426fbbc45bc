#!/usr/bin/env python3
"""sass_summary.py on cuobjdump-shaped listings: the functions --match
picks, opcodes without their modifiers and predicates, the smallest loop
around the first tensor-core instruction, the base's counts beside."""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def listing(funcs):
    """cuobjdump -sass text: funcs = [(name, [instruction text, ...])],
    16 bytes an instruction from address 0."""
    out = ["", "Fatbin elf code:", "================", "arch = sm_90a", ""]
    for name, insns in funcs:
        out.append(f"\t\tFunction : {name}")
        out.append('\t.headerflags\t@"EF_CUDA_SM90"')
        for i, text in enumerate(insns):
            out.append(f"        /*{16 * i:04x}*/                   {text} ;"
                       f"                                      /* 0x000000000000000 */")
            out.append("                                                      /* 0x000fe20000000a00 */")
        out.append("\t\t..........")
    return "\n".join(out) + "\n"


# A kernel: set-up, an outer loop (0x20..0xb0) around a tile loop
# (0x40..0x90) that holds the QGMMA, then the exit.
KERNEL = [
    "S2R R0, SR_TID.X",                      # 0x00
    "MOV R1, 0x0",                           # 0x10
    "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3], R4",  # 0x20 outer loop head
    "LDS R5, [R6]",                          # 0x30
    "QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR8], RZ, !UPT",  # 0x40 tile loop head
    "SHFL.BFLY PT, R7, R8, 0x1, 0x1f",       # 0x50
    "FADD R9, R7, |R7|",                     # 0x60
    "@!P1 FFMA R10, R9, R11, R10",           # 0x70
    "@P2 STG.E desc[UR4][R2.64], R10",       # 0x80
    "@!P0 BRA 0x40",                         # 0x90 back to the tile loop head
    "ISETP.GE.AND P0, PT, R1, R2, PT",       # 0xa0
    "@P0 BRA 0x20",                          # 0xb0 back to the outer loop head
    "EXIT",                                  # 0xc0
]
OTHER = ["S2R R0, SR_TID.X", "EXIT"]


class SassSummaryTest(unittest.TestCase):
    def run_summary(self, *args):
        out = subprocess.run([sys.executable, os.path.join(HERE, "sass_summary.py"), *args],
                             capture_output=True, text=True)
        return out.returncode, out.stdout, out.stderr

    def write(self, d, name, funcs):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(listing(funcs))
        return path

    def test_whole_function_and_tile_loop(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.write(d, "new.txt", [("_Z6KernelILi2EEvv", KERNEL), ("_Z5Otherv", OTHER)])
            rc, out, err = self.run_summary("--match", "Kernel", new)
            self.assertEqual(rc, 0, err)
            lines = out.splitlines()
            self.assertEqual(lines[0], "_Z6KernelILi2EEvv whole: 13 instructions")
            # Modifiers and predicates dropped: SHFL.BFLY is SHFL, @!P1 FFMA is FFMA.
            for op in ("SHFL 1", "FFMA 1", "BRA 2", "QGMMA 1", "SYNCS 1"):
                self.assertIn(op, lines[1])
            # The smallest loop around the QGMMA: 0x40..0x90, not the outer one.
            self.assertEqual(lines[2], "_Z6KernelILi2EEvv tile loop: 6 instructions")
            self.assertNotIn("LDS", lines[3])
            self.assertNotIn("Other", out)

    def test_base_counts_beside(self):
        with tempfile.TemporaryDirectory() as d:
            fewer = [i for i in KERNEL if not i.startswith("SHFL")]
            new = self.write(d, "new.txt", [("_Z6KernelILi2EEvv", fewer)])
            base = self.write(d, "base.txt", [("_Z6KernelILi2EEvv", KERNEL)])
            rc, out, err = self.run_summary(new, base)
            self.assertEqual(rc, 0, err)
            lines = out.splitlines()
            self.assertEqual(lines[0], "_Z6KernelILi2EEvv whole: 12 instructions (base 13, -1)")
            # The branch targets moved with the removal; the loop is still found.
            self.assertTrue(lines[2].startswith("_Z6KernelILi2EEvv tile loop: "), out)
            self.assertIn("SHFL 0 (base 1)", out)

    def test_no_match_fails(self):
        with tempfile.TemporaryDirectory() as d:
            new = self.write(d, "new.txt", [("_Z5Otherv", OTHER)])
            rc, _, err = self.run_summary("--match", "Kernel", new)
            self.assertEqual(rc, 1)
            self.assertIn("no function matches 'Kernel'", err)


if __name__ == "__main__":
    unittest.main()
