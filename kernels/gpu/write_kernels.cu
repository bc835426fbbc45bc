// K write (SPEC §3, §4): the step's new entries quantized (fp32 / bf16) or
// copied (pre-quantized) into their pages. One warp per entry; codes come
// from the same INDEXER_HD codecs as the cpu backend, so pages are
// bit-identical.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kWriteThreads = 256;
static_assert(kWriteThreads % kWarpSize == 0, "whole warps per block");
constexpr int kEntriesPerBlock = kWriteThreads / kWarpSize;

__device__ float WarpMax(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = fmaxf(v, ShflXor(v, m));
  return v;
}

// Max over aligned groups of 32 lanes (one MXFP4 block).
__device__ float Max32(float v) {
  for (int m = 16; m > 0; m /= 2) v = fmaxf(v, ShflXor(v, m));
  return v;
}

// Element d of staged row `local`.
__device__ float LoadInput(const WriteParams& p, int64_t local, int32_t d) {
  const int64_t at = local * p.layout.head_dim + d;
  if (p.source == KSource::kFloat32) return static_cast<const float*>(p.src)[at];
  return Bf16ToFloat(static_cast<const uint16_t*>(p.src)[at]);
}

// kVar: the cache's FP8 variant (a template constant, so the e4m3fn kernel
// is the one it always was).
template <Fp8Variant kVar>
__global__ void __launch_bounds__(kWriteThreads)
    WriteEntriesKernel(const WriteParams p) {
  const int64_t local = static_cast<int64_t>(blockIdx.x) * kEntriesPerBlock + WarpId();
  if (local >= p.num_entries) return;
  const int64_t i = p.entry_base + local;  // K row of the step
  const int lane = LaneId();
  const PageLayout& l = p.layout;

  // ---- where the entry goes: its sequence, position, page ----------------
  int32_t lo = 0, hi = p.step.num_seqs;  // seq_k_begin[lo] <= i < [hi]
  while (hi - lo > 1) {
    const int32_t mid = (lo + hi) / 2;
    if (p.step.seq_k_begin[mid] <= i) lo = mid; else hi = mid;
  }
  const int32_t pos = p.step.seq_old[lo] + static_cast<int32_t>(i - p.step.seq_k_begin[lo]);
  const EntryRef ref = LocateEntry(l, p.pool, p.step.block_table +
                                                  static_cast<int64_t>(lo) * p.step.max_pages, pos);
  uint8_t* page = const_cast<uint8_t*>(ref.page);
  const int32_t vb = l.value_bytes(), sb = l.scale_bytes();

  // ---- pre-quantized: copy bytes through the layout ----------------------
  if (p.source == KSource::kQuantized) {
    const uint8_t* src = static_cast<const uint8_t*>(p.src) + local * (vb + sb);
    for (int32_t b = lane; b < vb; b += kWarpSize) page[l.ValueOffset(ref.e, b)] = src[b];
    for (int32_t s = lane; s < sb; s += kWarpSize) page[l.ScaleOffset(ref.e, s)] = src[vb + s];
    return;
  }

  const int32_t dim = l.head_dim;
  if (l.format == KvFormat::kFp8) {
    // ---- FP8: one scale per entry --------------------------------------
    float amax = 0.f;
    for (int32_t d = lane; d < dim; d += kWarpSize) amax = fmaxf(amax, fabsf(LoadInput(p, local, d)));
    amax = WarpMax(amax);
    const float scale = Fp8KScale(amax, p.ue8m0, kVar);
    for (int32_t d = lane; d < dim; d += kWarpSize) {
      page[l.ValueOffset(ref.e, d)] = EncodeFp8(kVar, LoadInput(p, local, d) / scale);
    }
    const uint32_t bits = FloatToBits(scale);
    if (lane < 4) page[l.ScaleOffset(ref.e, lane)] = static_cast<uint8_t>(bits >> (8 * lane));
    return;
  }

  // ---- MXFP4: one block of 32 elements at a time -------------------------
  // Lanes 32..63 of a 64-wide wave mirror lanes 0..31 and store nothing.
  const int32_t j = lane % kMxBlock;
  for (int32_t blk = 0; blk < dim / kMxBlock; ++blk) {
    const float x = LoadInput(p, local, blk * kMxBlock + j);
    const int32_t e = MxBlockExponent(Max32(fabsf(x)));
    const uint32_t nib = EncodeE2m1(x * format_internal::ExactPow2(-e));
    const uint32_t hi_nib = ShflDown(nib, 1);
    if (lane < kMxBlock && (j & 1) == 0) {
      page[l.ValueOffset(ref.e, blk * (kMxBlock / 2) + j / 2)] =
          static_cast<uint8_t>(nib | (hi_nib << 4));
    }
    if (lane == 0) page[l.ScaleOffset(ref.e, blk)] = static_cast<uint8_t>(e + 127);
  }
}

// Whether element `i` of `part` is bad (one element, any kind).
__device__ bool BadElement(const CheckParams& p, const CheckPart& part, int64_t i) {
  switch (part.kind) {
    case CheckKind::kFloat32:
      return !isfinite(static_cast<const float*>(part.src)[i]);
    case CheckKind::kBf16:  // all-ones exponent: Inf or NaN
      return (static_cast<const uint16_t*>(part.src)[i] & 0x7f80u) == 0x7f80u;
    case CheckKind::kFp8Codes:
      return IsFp8Nan(p.layout.fp8, static_cast<const uint8_t*>(part.src)[i]);
    case CheckKind::kE8m0:
      return static_cast<const uint8_t*>(part.src)[i] == 0xff;
    case CheckKind::kQuantized: {
      const PageLayout& l = p.layout;
      const uint8_t* e = static_cast<const uint8_t*>(part.src) + i * l.entry_bytes();
      const int32_t vb = l.value_bytes();
      if (l.format == KvFormat::kFp8) {
        for (int32_t b = 0; b < vb; ++b) {
          if (IsFp8Nan(l.fp8, e[b])) return true;
        }
        float s;
        memcpy(&s, e + vb, 4);
        return !isfinite(s) || !(s > 0.f);
      }
      for (int32_t b = 0; b < l.scale_bytes(); ++b) {
        if (e[vb + b] == 0xff) return true;
      }
      return false;
    }
  }
  return false;
}

// Blocks [block_begin[k], block_begin[k + 1]) take part k; a thread takes
// unit u of it: 16 bytes (elements u * per .. u * per + per - 1, per = 16 /
// element bytes) where the part is vectorized, else element u. Each unit's
// first bad element lowers the part's slot; the launch's last block
// publishes the slots and puts the state back (CheckParams::state).
__global__ void CheckInputKernel(CheckParams p) {
  int k = 0;
  while (k + 1 < p.num_parts && blockIdx.x >= static_cast<uint32_t>(p.block_begin[k + 1])) ++k;
  const CheckPart& part = p.parts[k];
  const int64_t blocks = p.block_begin[k + 1] - p.block_begin[k];
  const int64_t stride = blocks * blockDim.x;
  const int32_t per = part.per_unit;
  const int64_t units = (part.count + per - 1) / per;
  for (int64_t u = (blockIdx.x - p.block_begin[k]) * int64_t{blockDim.x} + threadIdx.x; u < units;
       u += stride) {
    const int64_t first = u * per;
    const int64_t last = first + per < part.count ? first + per : part.count;
    if (per > 1 && last - first == per) {
      // One 16-byte load, then its elements in order (the lowest bad one).
      uint4 v = static_cast<const uint4*>(part.src)[u];
      const uint8_t* bytes = reinterpret_cast<const uint8_t*>(&v);
      int32_t bad = -1;
      for (int32_t j = 0; j < per && bad < 0; ++j) {
        bool b = false;
        if (part.kind == CheckKind::kFloat32) {
          float f;
          memcpy(&f, bytes + 4 * j, 4);
          b = !isfinite(f);
        } else if (part.kind == CheckKind::kBf16) {
          uint16_t h;
          memcpy(&h, bytes + 2 * j, 2);
          b = (h & 0x7f80u) == 0x7f80u;
        } else if (part.kind == CheckKind::kFp8Codes) {
          b = IsFp8Nan(p.layout.fp8, bytes[j]);
        } else {
          b = bytes[j] == 0xff;
        }
        if (b) bad = j;
      }
      if (bad >= 0) atomicMin(&p.state[part.slot], static_cast<uint32_t>(first + bad));
      continue;
    }
    for (int64_t i = first; i < last; ++i) {
      if (BadElement(p, part, i)) {
        atomicMin(&p.state[part.slot], static_cast<uint32_t>(i));
        break;
      }
    }
  }
  // ---- the last block publishes the verdict and resets the state ---------
  // Every thread's atomics are ordered before its block's count.
  __threadfence();
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (atomicAdd(&p.state[kCheckSlots], 1u) != static_cast<uint32_t>(p.block_begin[p.num_parts]) - 1) {
    return;
  }
  __threadfence();
  // Only this launch's slots: a call that checks K and Q in two launches
  // (the single-path calls) keeps the first one's verdict.
  for (int i = 0; i < p.num_parts; ++i) {
    const int32_t s = p.parts[i].slot;
    p.verdict[s] = atomicExch(&p.state[s], 0xffffffffu);
  }
  atomicExch(&p.state[kCheckSlots], 0u);
  __threadfence_system();
}

}  // namespace

absl::Status LaunchCheckInput(const CheckParams& p_in, Stream stream) {
  if (p_in.num_parts < 1 || p_in.num_parts > kMaxCheckParts) {
    return absl::InvalidArgumentError("check: expected 1..kMaxCheckParts parts");
  }
  // Each part as many blocks as its units need (at most kMaxCheckBlocks, a
  // grid-stride walk past that): a layer's Q at B=64 (512 KiB) is 128
  // blocks of 16-byte units, its weights 4, its new K entries 1.
  constexpr int64_t kMaxCheckBlocks = 1024;
  CheckParams p = p_in;
  p.block_begin[0] = 0;
  for (int i = 0; i < p.num_parts; ++i) {
    CheckPart& part = p.parts[i];
    const int32_t elem = part.kind == CheckKind::kFloat32 ? 4 : part.kind == CheckKind::kBf16 ? 2 : 1;
    const bool vec = part.kind != CheckKind::kQuantized &&
                     reinterpret_cast<uintptr_t>(part.src) % 16 == 0;
    part.per_unit = vec ? 16 / elem : 1;
    const int64_t units = (part.count + part.per_unit - 1) / part.per_unit;
    const int64_t want = (units + kWriteThreads - 1) / kWriteThreads;
    p.block_begin[i + 1] = p.block_begin[i] + static_cast<int32_t>(want < kMaxCheckBlocks ? want : kMaxCheckBlocks);
  }
  // A part of no elements still takes no block; a launch of none is none.
  if (p.block_begin[p.num_parts] == 0) return absl::OkStatus();
  GPU_LAUNCH(CheckInputKernel, p.block_begin[p.num_parts], kWriteThreads, 0, stream, p);
  return absl::OkStatus();
}

absl::Status LaunchWriteEntries(const WriteParams& p, Stream stream) {
  if (p.num_entries == 0) return absl::OkStatus();
  const int blocks = (p.num_entries + kEntriesPerBlock - 1) / kEntriesPerBlock;
  if (p.layout.format == KvFormat::kFp8 && p.layout.fp8 == Fp8Variant::kE4m3fnuz) {
    GPU_LAUNCH(WriteEntriesKernel<Fp8Variant::kE4m3fnuz>, blocks, kWriteThreads, 0, stream, p);
  } else {
    GPU_LAUNCH(WriteEntriesKernel<Fp8Variant::kE4m3fn>, blocks, kWriteThreads, 0, stream, p);
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer
