"""Registered regions (SPEC §6 data plane): tensors by reference.

HostRegion: a POSIX shared-memory object (multiprocessing.shared_memory)
that the daemon maps. MemfdRegion: anonymous memory (os.memfd_create) whose
descriptor goes to the daemon over its memfd socket (send_memfd; feature
"host_regions_memfd"), nothing to name or unlink. DeviceRegion: GPU memory of a torch CUDA tensor,
exported with cuIpcGetMemHandle (cuda_ipc.py). Both carry an Arena that packs
the tensors of a layer at 16-byte-aligned offsets, and make Tensor /
TensorRef messages that refer to them.

The ordering contract: a request's input references must be complete when
it is sent (for device regions: the writes finished, e.g. after
torch.cuda.synchronize() or an event wait); the daemon's output (topk_out)
is complete when the reply arrives. A region must not be rewritten while a
request that reads it is in flight.

Importing this module never imports torch; DeviceRegion does, when used.
"""

import mmap
import os
import secrets
import socket
from multiprocessing import shared_memory

import numpy as np

from .errors import RegionError
from .tensors import _CARRIER, dtype_name, nbytes, ref_tensor, tensor_ref

ALIGN = 16

# The memfd socket's wire (proto/memfd_wire.h): one SOCK_SEQPACKET message of
# these bytes with exactly one descriptor; the reply is "ok <token> <ttl_ms>"
# or "error <message>".
MEMFD_HELLO = b"indexer.memfd.v1"


def send_memfd(socket_path, fd, timeout=10.0):
    """Passes memfd `fd` over the daemon's memfd socket (SCM_RIGHTS) and
    returns the token it answered (single-use, valid for the daemon's
    memfd_token_ttl_ms), for Client.register_memfd_token. RegionError with
    the daemon's text when it refuses the descriptor."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        s.connect(socket_path)
        socket.send_fds(s, [MEMFD_HELLO], [fd])
        reply = s.recv(1024).decode("utf-8", "replace")
    parts = reply.split(" ")
    if len(parts) == 3 and parts[0] == "ok" and len(parts[1]) == 32:
        return parts[1]
    if reply.startswith("error "):
        raise RegionError(f"memfd socket {socket_path}: {reply[6:]}")
    raise RegionError(f"memfd socket {socket_path}: unexpected reply {reply[:64]!r}")


def align_up(n, a=ALIGN):
    return (n + a - 1) // a * a


class Arena:
    """A bump allocator over [0, capacity): each alloc returns the next
    ALIGN-aligned offset. reset() frees everything (e.g. per layer)."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.used = 0

    def alloc(self, nbytes_):
        off = align_up(self.used)
        if off + nbytes_ > self.capacity:
            raise RegionError(f"region full: {nbytes_} bytes at offset {off} exceed its "
                              f"{self.capacity} bytes")
        self.used = off + nbytes_
        return off

    def reset(self):
        self.used = 0


def packed_size(*sizes):
    """Bytes an Arena needs to hold tensors of these byte sizes."""
    total = 0
    for s in sizes:
        total = align_up(total) + s
    return align_up(total)


class _Region:
    """Shared part of host and device regions: the id, the arena, refs."""

    region = None  # id from RegisterRegion

    def _check(self, offset, n):
        if self.region is None:
            raise RegionError(f"region {self.name!r}: not registered")
        if offset % ALIGN:
            raise RegionError(f"region {self.name!r}: offset {offset} is not {ALIGN}-byte aligned")
        if offset + n > self.nbytes:
            raise RegionError(f"region {self.name!r}: [{offset}, {offset + n}) is beyond its "
                              f"{self.nbytes} bytes")

    def ref(self, dtype, shape, offset):
        """A Tensor message referring to this region at offset."""
        self._check(offset, nbytes(dtype, shape))
        return ref_tensor(dtype, shape, self.region, offset)

    def out_ref(self, dtype, shape, offset):
        """A TensorRef (LayerRequest.topk_out) for a dtype x shape output."""
        n = nbytes(dtype, shape)
        self._check(offset, n)
        return tensor_ref(self.region, offset, n)


class _HostArrays:
    """numpy views of host memory (self._buf()) for host-region helpers."""

    def array(self, offset, dtype, shape):
        """A numpy view of the region: shape x the carrier of wire dtype."""
        carrier = _CARRIER[dtype]
        self._check(offset, nbytes(dtype, shape))
        return np.ndarray(tuple(shape), dtype=carrier, buffer=self._buf(), offset=offset)

    def put(self, array, dtype, offset=None):
        """Copies array into the region (at offset, or the arena's next slot)
        and returns a Tensor referring to it."""
        array = np.asarray(array)
        carrier = _CARRIER[dtype]
        if array.dtype.kind != carrier.kind or array.dtype.itemsize != carrier.itemsize:
            raise RegionError(f"{dtype_name(dtype)} takes numpy {carrier.name}, got {array.dtype}")
        n = nbytes(dtype, array.shape)
        if offset is None:
            offset = self.arena.alloc(n)
        self.array(offset, dtype, array.shape)[...] = array
        return self.ref(dtype, array.shape, offset)

    def output(self, dtype, shape, offset=None):
        """Reserves an output slot: returns (TensorRef for topk_out, numpy
        view to read after the reply)."""
        n = nbytes(dtype, shape)
        if offset is None:
            offset = self.arena.alloc(n)
        return self.out_ref(dtype, shape, offset), self.array(offset, dtype, shape)

    def unregister(self):
        if self.region is not None:
            region, self.region = self.region, None
            self.client.unregister_region(region)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class MemfdRegion(_HostArrays, _Region):
    """Anonymous host memory registered with the daemon by descriptor.

    MemfdRegion(client, nbytes, name=None, socket_path=None) creates a memfd
    (MFD_CLOEXEC | MFD_ALLOW_SEALING; the daemon seals it against shrinking),
    maps it, passes it over the daemon's memfd socket (socket_path, default
    ServerInfo.memfd_socket) and registers the token. close() unregisters
    and unmaps; the memory goes once the daemon has let go too. The daemon
    must run on this host and list the feature "host_regions_memfd".
    """

    def __init__(self, client, nbytes_, name=None, socket_path=None):
        self.client = client
        self.name = name or f"py-memfd-{secrets.token_hex(4)}"
        self.nbytes = int(nbytes_)
        self.arena = Arena(self.nbytes)
        self.fd = os.memfd_create(self.name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.nbytes)
            self.mm = mmap.mmap(self.fd, self.nbytes)
            self.region, self.lease_ms = client.register_memfd_region(
                self.name, self.fd, self.nbytes, socket_path=socket_path)
        except BaseException:
            self._release()
            raise

    def _buf(self):
        return self.mm

    def _release(self):
        mm, self.mm = getattr(self, "mm", None), None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                pass  # numpy views still use it: unmapped when they go
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)

    def close(self):
        try:
            self.unregister()
        finally:
            self._release()


class HostRegion(_HostArrays, _Region):
    """A shared-memory region registered with the daemon.

    HostRegion(client, nbytes, name=None) creates the shared-memory object,
    registers it and owns both: close() unregisters (when registered) and
    unlinks. Use as a context manager. The daemon must run on this host.
    """

    def __init__(self, client, nbytes_, name=None):
        self.client = client
        self.name = name or f"py-{secrets.token_hex(4)}"
        self.nbytes = int(nbytes_)
        self.shm = shared_memory.SharedMemory(create=True, size=self.nbytes,
                                              name=f"idx-{secrets.token_hex(8)}")
        self.shm_name = "/" + self.shm.name  # shm_open's name
        self.arena = Arena(self.nbytes)
        try:
            self.region, self.lease_ms = client.register_host_region(
                self.name, self.shm_name, self.nbytes)
        except BaseException:
            self._release_shm()
            raise

    def _buf(self):
        return self.shm.buf

    def _release_shm(self):
        if self.shm is not None:
            shm, self.shm = self.shm, None
            shm.close()
            shm.unlink()

    def close(self):
        try:
            self.unregister()
        finally:
            self._release_shm()


class DeviceRegion(_Region):
    """GPU memory registered with the daemon, through torch.

    DeviceRegion(client, nbytes, device=0) allocates a torch uint8 buffer on
    cuda:device and registers it; DeviceRegion.of_tensor(client, t) registers
    the bytes of an existing contiguous CUDA tensor. close() unregisters (the
    buffer is torch's: keep the region alive as long as the daemon may use
    it). The daemon must run on the same device or on a peer of it.
    """

    def __init__(self, client, nbytes_=None, device=0, name=None, tensor=None):
        import torch  # noqa: F401  (only device regions need torch)

        from . import cuda_ipc
        if tensor is None:
            tensor = torch.empty(int(nbytes_), dtype=torch.uint8, device=f"cuda:{device}")
        if not tensor.is_cuda or not tensor.is_contiguous():
            raise RegionError("device region: expected a contiguous CUDA tensor")
        self.client = client
        self.name = name or f"py-dev-{secrets.token_hex(4)}"
        self.tensor = tensor
        self.buffer = tensor.view(-1).view(torch.uint8)
        self.nbytes = self.buffer.numel()
        self.device = tensor.device.index
        self.arena = Arena(self.nbytes)
        export = cuda_ipc.export(tensor.data_ptr(), self.device)
        self.device_uuid = export.device_uuid
        self.region, self.lease_ms = client.register_device_region(
            self.name, export.handle, self.nbytes, offset=export.offset,
            device_uuid=export.device_uuid)

    @classmethod
    def of_tensor(cls, client, tensor, name=None):
        return cls(client, name=name, tensor=tensor)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def view(self, offset, torch_dtype, shape):
        """A torch view of the region at offset (e.g. torch.float8_e4m3fn
        for FP8 Q, torch.int32 for the top-k)."""
        import torch
        n = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=torch_dtype).element_size()
        if offset % ALIGN or offset + n > self.nbytes:
            raise RegionError(f"region {self.name!r}: [{offset}, {offset + n}) misaligned or "
                              f"beyond its {self.nbytes} bytes")
        return self.buffer[offset:offset + n].view(torch_dtype).view(*shape)

    def unregister(self):
        if self.region is not None:
            region, self.region = self.region, None
            self.client.unregister_region(region)

    def close(self):
        self.unregister()
