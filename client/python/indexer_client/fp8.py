"""FP8 e4m3fn (OCP, max 448) in numpy, bit-exact with the daemon (SPEC §3).

``encode_e4m3`` rounds to nearest even, saturates at +-448 and keeps the sign
of values that round to zero, as ``kernels/format/fp8_inl.h`` does; the
quantizers apply SPEC §3's scale rules. With them a front-end can send
pre-quantized K entries and FP8 Q whose values it knows exactly.
"""

import numpy as np

E4M3_MAX = 448.0


def _decode_table():
    codes = np.arange(256, dtype=np.uint32)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    normal = (1.0 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7.0)
    sub = man * 2.0 ** -9
    val = sign * np.where(exp == 0, sub, normal)
    val[(exp == 0xF) & ((codes & 0x7) == 0x7)] = np.nan
    return val.astype(np.float32)


_DECODE = _decode_table()


def decode_e4m3(codes):
    """e4m3fn codes (uint8) -> float32 values (0x7f / 0xff are NaN)."""
    return _DECODE[np.asarray(codes, dtype=np.uint8)]


def encode_e4m3(x):
    """float32 -> e4m3fn codes (uint8). REQUIRES: x finite."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.int64)
    sign = (bits >> 24) & 0x80
    mag = bits & 0x7FFFFFFF
    exp = (mag >> 23) - 127
    # Normal in e4m3 (exponent >= -6): re-bias, drop 20 mantissa bits, round
    # half to even on the integer code (a carry bumps the exponent).
    v = mag - (120 << 23)
    r = v >> 20
    rem = v & 0xFFFFF
    r_norm = r + ((rem > 0x80000) | ((rem == 0x80000) & ((r & 1) == 1)))
    # Subnormal in e4m3: units of 2^-9.
    m = (mag & 0x7FFFFF) | 0x800000
    shift = np.clip(14 - exp, 1, 40)
    r = m >> shift
    rem = m & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    r_sub = r + ((rem > half) | ((rem == half) & ((r & 1) == 1)))
    r_sub = np.where((exp == -127) | (shift > 24), 0, r_sub)
    code = np.where(exp >= -6, r_norm, r_sub)
    code = np.where(mag >= 0x43E00000, 0x7E, code)
    return (sign | code).astype(np.uint8)


def _exact_pow2(e):
    return np.ldexp(np.float32(1.0), e.astype(np.int32)).astype(np.float32)


def pow2_at_least_over_448(a):
    """Smallest power of two s with a <= 448 * s (exact). REQUIRES: a normal > 0."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    bits = a.view(np.uint32).astype(np.int64)
    exp = (bits >> 23) - 127
    k = np.where((bits & 0x7FFFFF) <= 0x600000, exp - 8, exp - 7)
    return _exact_pow2(k)


def k_scale(amax, ue8m0):
    """K entry scale of SPEC §3 for per-entry absolute maxima ``amax``."""
    a = np.maximum(np.asarray(amax, dtype=np.float32), np.float32(1e-4))
    if ue8m0:
        return pow2_at_least_over_448(a)
    return (a / np.float32(E4M3_MAX)).astype(np.float32)


def quantize_k(k, ue8m0):
    """[n, D] float32 K -> [n, D + 4] uint8 linear FP8 entries (D codes, then
    the fp32 scale, little-endian): the pre-quantized UINT8 form of
    LayerRequest.k and WriteEntriesRequest."""
    k = np.ascontiguousarray(k, dtype=np.float32)
    n, d = k.shape
    s = k_scale(np.abs(k).max(axis=1) if n else np.zeros(0, np.float32), ue8m0)
    out = np.empty((n, d + 4), dtype=np.uint8)
    out[:, :d] = encode_e4m3((k / s[:, None]).astype(np.float32))
    out[:, d:] = s.astype("<f4").view(np.uint8).reshape(n, 4)
    return out


def decode_k(entries, d):
    """[n, D + 4] linear FP8 entries -> (values [n, D] float32, scales [n])."""
    entries = np.ascontiguousarray(entries, dtype=np.uint8)
    values = decode_e4m3(entries[:, :d])
    scales = entries[:, d:d + 4].copy().view("<f4").reshape(-1)
    return values, scales


def quantize_q(q):
    """[rows, H, D] float32 Q -> (codes [rows, H, D] uint8, scales [rows, H]
    float32): per (row, head) the smallest power of two
    s >= max(amax, 1e-10) / 448, codes = e4m3(q / s). The caller folds s into
    that head's weight (w' = w * s * D^-0.5 * H^-0.5, SPEC §3)."""
    q = np.ascontiguousarray(q, dtype=np.float32)
    amax = np.maximum(np.abs(q).max(axis=-1), np.float32(1e-10))
    s = pow2_at_least_over_448(amax)
    codes = encode_e4m3((q / s[..., None]).astype(np.float32))
    return codes, s
