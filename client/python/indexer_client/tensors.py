"""numpy <-> indexer.v1.Tensor (little-endian, row-major, unpadded).

Element types on the wire and their numpy carriers:

  FP32      float32
  BF16      uint16 (the bfloat16 bits); float32 input is rounded to nearest
            even by ``to_bf16_bits``
  INT32     int32
  UINT8     uint8 (packed MXFP4 e2m1 pairs, e8m0 scales, whole K entries)
  FP8_E4M3  uint8 (the e4m3fn codes)
  FP8_E4M3FNUZ  uint8 (the e4m3fnuz codes of gfx942 hardware; converted by the
            daemon when the layer's cache holds e4m3fn, and the other way)

FP8 and MXFP4 data therefore travel as uint8 arrays with the declared dtype
set explicitly: ``to_tensor(codes, DataType.FP8_E4M3)``.
"""

import numpy as np

from ._pb import indexer_pb2 as pb
from .errors import TensorError

DataType = pb.DataType

# dtype -> (numpy carrier, bytes per element)
_CARRIER = {
    pb.FP32: np.dtype("<f4"),
    pb.BF16: np.dtype("<u2"),
    pb.FP16: np.dtype("<f2"),
    pb.INT32: np.dtype("<i4"),
    pb.UINT8: np.dtype("u1"),
    pb.FP8_E4M3: np.dtype("u1"),
    pb.FP8_E4M3FNUZ: np.dtype("u1"),
}

# numpy dtype -> wire dtype when the caller does not say.
_DEFAULT = {
    np.dtype("float32"): pb.FP32,
    np.dtype("int32"): pb.INT32,
    np.dtype("uint8"): pb.UINT8,
}


def dtype_name(dtype):
    return pb.DataType.Name(dtype)


def itemsize(dtype):
    """Bytes per element of a wire dtype."""
    try:
        return _CARRIER[dtype].itemsize
    except KeyError:
        raise TensorError(f"dtype {dtype}: not a tensor element type") from None


def nbytes(dtype, shape):
    return int(np.prod(shape, dtype=np.int64)) * itemsize(dtype)


def to_bf16_bits(x):
    """float32 array -> bfloat16 bits (uint16), round to nearest even.

    NaN stays a (quiet) NaN; infinities and overflow to infinity follow IEEE.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = ((bits[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return out


def from_bf16_bits(bits):
    """bfloat16 bits (uint16) -> float32 (exact)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _check_shape(array, shape, what):
    if shape is None:
        return
    want = tuple(int(d) for d in shape)
    if tuple(array.shape) != want:
        raise TensorError(f"{what}: expected shape {list(want)}, got {list(array.shape)}")


def to_tensor(array, dtype=None, shape=None, what="tensor"):
    """An inline Tensor holding ``array``.

    dtype: the wire dtype; default FP32 for float32, INT32 for int32, UINT8
      for uint8. BF16 takes uint16 bits, or float32 (rounded to nearest even).
      FP8_E4M3 takes uint8 codes. Anything else raises TensorError.
    shape: when given, the array's shape must equal it (TensorError naming
      ``what`` otherwise).
    """
    array = np.asarray(array)
    if dtype is None:
        dtype = _DEFAULT.get(array.dtype)
        if dtype is None:
            raise TensorError(f"{what}: numpy dtype {array.dtype} has no default wire dtype; "
                              "pass dtype= (FP32, BF16, INT32, UINT8, FP8_E4M3, FP8_E4M3FNUZ)")
    if dtype == pb.BF16 and array.dtype == np.float32:
        array = to_bf16_bits(array)
    carrier = _CARRIER.get(dtype)
    if carrier is None or dtype == pb.FP16:
        raise TensorError(f"{what}: dtype {dtype} is not accepted")
    if array.dtype.kind != carrier.kind or array.dtype.itemsize != carrier.itemsize:
        raise TensorError(f"{what}: {dtype_name(dtype)} takes numpy {carrier.name} "
                          f"(got {array.dtype})")
    _check_shape(array, shape, what)
    data = np.ascontiguousarray(array, dtype=carrier).tobytes()
    return pb.Tensor(dtype=dtype, shape=list(array.shape), data=data)


def from_tensor(tensor, what="tensor"):
    """The inline bytes of ``tensor`` as an array of its carrier dtype.

    BF16 comes back as uint16 bits (see from_bf16_bits), FP8_E4M3 as uint8
    codes. A reference tensor (no inline bytes) or a byte count that does not
    match shape x dtype raises TensorError.
    """
    if tensor.HasField("ref"):
        raise TensorError(f"{what}: a reference tensor has no inline bytes "
                          f"(region {tensor.ref.region}, offset {tensor.ref.offset})")
    carrier = _CARRIER.get(tensor.dtype)
    if carrier is None:
        raise TensorError(f"{what}: unknown dtype {tensor.dtype}")
    shape = tuple(tensor.shape)
    want = nbytes(tensor.dtype, shape)
    if len(tensor.data) != want:
        raise TensorError(f"{what}: expected {list(shape)} {dtype_name(tensor.dtype)} "
                          f"({want} bytes), got {len(tensor.data)} bytes")
    return np.frombuffer(tensor.data, dtype=carrier).reshape(shape)


def ref_tensor(dtype, shape, region, offset):
    """A Tensor referring to ``nbytes(dtype, shape)`` bytes of a registered
    region at ``offset`` (16-byte aligned, SPEC §6)."""
    if offset % 16:
        raise TensorError(f"ref offset {offset}: expected a multiple of 16")
    shape = [int(d) for d in shape]
    return pb.Tensor(dtype=dtype, shape=shape,
                     ref=pb.TensorRef(region=int(region), offset=int(offset),
                                      bytes=nbytes(dtype, shape)))


def tensor_ref(region, offset, nbytes_):
    """A bare TensorRef (LayerRequest.topk_out)."""
    if offset % 16:
        raise TensorError(f"ref offset {offset}: expected a multiple of 16")
    return pb.TensorRef(region=int(region), offset=int(offset), bytes=int(nbytes_))
