"""The CUDA IPC export of device regions (indexer_client.cuda_ipc), checked
across processes as the daemon uses it: a child process opens the exported
handle, adds the offset and reads the tensor's bytes back. Needs torch with
a CUDA device; skipped (with the reason) elsewhere, e.g. in CI.
"""

import os
import subprocess
import sys
import unittest

try:
    import torch
    _CUDA = torch.cuda.is_available()
except ImportError:
    torch, _CUDA = None, False

_CHILD = r"""
import ctypes, sys
from indexer_client import cuda_ipc
handle, offset, n, ordinal = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lib = cuda_ipc._cuda()
buf = (ctypes.c_ubyte * n)()
# One retained primary context around open, copy and close: released in
# between, it (and the mapping in it) would be destroyed.
with cuda_ipc._Context(ordinal):
    base = cuda_ipc.open_handle(handle, ordinal)
    cuda_ipc._check(lib, lib.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(base + offset), ctypes.c_size_t(n)), "cuMemcpyDtoH")
    cuda_ipc.close_handle(base, ordinal)
sys.stdout.write(bytes(buf).hex())
"""


@unittest.skipUnless(_CUDA, "needs torch with a CUDA device")
class CudaIpcTest(unittest.TestCase):
    def test_child_process_reads_the_exported_bytes(self):
        from indexer_client import cuda_ipc
        dev = torch.cuda.current_device()
        # A tensor 4096 bytes into a block of the caching allocator.
        block = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
        t = block[4096:4096 + 1000]
        t.copy_(torch.arange(1000, device=dev) % 251)
        torch.cuda.synchronize()
        e = cuda_ipc.export(t.data_ptr(), dev)
        self.assertEqual(len(e.handle), 64)
        whole = cuda_ipc.export(block.data_ptr(), dev)
        self.assertEqual(e.handle, whole.handle)  # one allocation, one handle
        self.assertEqual(e.offset, whole.offset + 4096)
        self.assertGreaterEqual(e.alloc_bytes, e.offset + 1000)
        props = torch.cuda.get_device_properties(dev)
        if hasattr(props, "uuid"):
            want = str(props.uuid)  # torch prints it without nvidia-smi's "GPU-"
            self.assertEqual(e.device_uuid, want if want.startswith("GPU-") else "GPU-" + want)
        out = subprocess.run([sys.executable, "-c", _CHILD, e.handle.hex(), str(e.offset), "1000",
                              str(dev)], capture_output=True, text=True, env=os.environ,
                             timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(bytes.fromhex(out.stdout), bytes(t.cpu().numpy()))
