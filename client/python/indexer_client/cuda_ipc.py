"""CUDA IPC export of GPU memory for device regions, via ctypes on the CUDA
driver (libcuda.so.1, present wherever a CUDA device is). No torch needed
here; importing this module loads nothing until a function is called.

A cuIpcGetMemHandle handle names a whole allocation (one cudaMalloc block,
which torch's caching allocator may carve into many tensors), so a region
is (handle, offset of the tensor in the allocation, bytes). Memory from
cuMemCreate/VMM (torch's expandable_segments) cannot be exported this way.
"""

import ctypes
import dataclasses

_CU_IPC_HANDLE_SIZE = 64
_CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_lib = None


class CudaError(RuntimeError):
    pass


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _CU_IPC_HANDLE_SIZE)]


def _cuda():
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaError(f"device regions need the CUDA driver (libcuda.so.1): {e}") from None
        _check(lib, lib.cuInit(0), "cuInit(0)")
        _lib = lib
    return _lib


def _check(lib, rc, call):
    if rc != 0:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(rc, ctypes.byref(name))
        raise CudaError(f"{call}: {name.value.decode() if name.value else rc}")


class _Context:
    """The device's primary context, current on this thread while in use
    (the one torch's runtime uses)."""

    def __init__(self, ordinal):
        self.lib = _cuda()
        self.dev = ctypes.c_int()
        _check(self.lib, self.lib.cuDeviceGet(ctypes.byref(self.dev), ordinal),
               f"cuDeviceGet({ordinal})")

    def __enter__(self):
        self.ctx = ctypes.c_void_p()
        _check(self.lib, self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev),
               "cuDevicePrimaryCtxRetain")
        _check(self.lib, self.lib.cuCtxPushCurrent_v2(self.ctx), "cuCtxPushCurrent")
        return self

    def __exit__(self, *exc):
        popped = ctypes.c_void_p()
        self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
        self.lib.cuDevicePrimaryCtxRelease_v2(self.dev)
        return False


def device_uuid(ordinal):
    """"GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" as nvidia-smi -L prints it."""
    ctx = _Context(ordinal)
    raw = (ctypes.c_ubyte * 16)()
    _check(ctx.lib, ctx.lib.cuDeviceGetUuid(raw, ctx.dev), "cuDeviceGetUuid")
    h = bytes(raw).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclasses.dataclass
class Export:
    handle: bytes       # 64 bytes of CUipcMemHandle (= cudaIpcMemHandle_t)
    offset: int         # of the pointer within the allocation
    alloc_bytes: int    # size of the allocation
    device_uuid: str


def export(ptr, ordinal):
    """Exports the allocation holding device pointer ptr on device ordinal."""
    ctx = _Context(ordinal)
    with ctx:
        lib = ctx.lib
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        _check(lib, lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                ctypes.c_uint64(ptr)),
               f"cuMemGetAddressRange(0x{ptr:x})")
        handle = _IpcHandle()
        _check(lib, lib.cuIpcGetMemHandle(ctypes.byref(handle), base),
               f"cuIpcGetMemHandle(0x{base.value:x}) (VMM memory, e.g. torch's "
               "expandable_segments, cannot be exported)")
    # All 64 bytes: reading the c_char array field would stop at its first
    # NUL byte.
    raw_handle = ctypes.string_at(ctypes.addressof(handle), _CU_IPC_HANDLE_SIZE)
    return Export(handle=raw_handle, offset=ptr - base.value,
                  alloc_bytes=size.value, device_uuid=device_uuid(ordinal))


def open_handle(handle, ordinal):
    """Maps an exported allocation in this process (another process than the
    exporter's); returns its device pointer. For tests of the export."""
    ctx = _Context(ordinal)
    with ctx:
        h = _IpcHandle()
        raw = bytes(handle)
        if len(raw) != _CU_IPC_HANDLE_SIZE:
            raise ValueError(f"ipc handle: expected {_CU_IPC_HANDLE_SIZE} bytes, got {len(raw)}")
        ctypes.memmove(ctypes.addressof(h), raw, _CU_IPC_HANDLE_SIZE)
        ptr = ctypes.c_uint64()
        _check(ctx.lib, ctx.lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h,
                                                      _CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
               "cuIpcOpenMemHandle")
    return ptr.value


def close_handle(ptr, ordinal):
    ctx = _Context(ordinal)
    with ctx:
        _check(ctx.lib, ctx.lib.cuIpcCloseMemHandle(ctypes.c_uint64(ptr)), "cuIpcCloseMemHandle")
