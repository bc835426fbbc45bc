// Hopper (sm_90a) FP8 dense logits on warpgroup MMA, read from the pages in
// place. A persistent grid of one-warpgroup blocks; block b takes an equal
// contiguous share of the plan's work units (row group of one sequence,
// entry range) and streams all their 64-entry tiles through one pipeline,
// restaging Q only when the row group changes. K tiles of 64 entries stream through a
// kStages-deep cp.async pipeline into shared memory in the 128-byte swizzle
// (each lane copies 16-byte chunks found through PageLayout, so any layout
// whose value chunks are 16-byte aligned works); the group's Q rows sit in
// shared memory as one B operand of N = kRows * H heads (H = 16, 32 or 64,
// a template constant).
//   wgmma m64nNk32 x 4:  C[64 entries, N] = K[64, 128] . Q[N, 128]^T
//   epilogue:             logit[e] = kscale[e] * sum_h w[h] * ReLU(C[e, h])
// Tensor-mapped pools run the warp-specialized form in logits_wgmma_ws.cu
// instead; this kernel keeps the layouts the tensor map cannot read (and
// the tensor-mapped ones when INDEXER_GPU_WGMMA_WS=0, for A/B runs), and the
// candidate consumer's gather walk where logits_wgmma_ws.cu's does not take
// it (gather_logits.h): its tiles' rows are pool slots found entry by entry,
// its logits land at the slots (compact rows).
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "kernels/gpu/dispatch.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/per_device.h"
#include "kernels/gpu/hopper/wgmma_sm90.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kWgThreads = 128;  // one warpgroup
constexpr int kWgTile = 64;      // entries per K tile (wgmma M)
constexpr int kWgDim = 128;      // D: one 128-byte swizzle row per entry
constexpr int kStages = 4;
constexpr int kTileBytes = kWgTile * kWgDim;  // 8 KiB

template <int kHeads, int kRows>
constexpr int WgSmemBytes() {
  // Q tile | kStages K tiles | kStages x 64 kscales | weights | 1 KiB align.
  return kRows * kHeads * kWgDim + kStages * kTileBytes + kStages * kWgTile * 4 +
         kRows * kHeads * 4 + 1024;
}

template <int kHeads, int kRows>
__global__ void __launch_bounds__(kWgThreads)
    DenseLogitsWgmmaKernel(const INDEXER_GRID_CONSTANT LogitsParams p) {
#if INDEXER_GPU_WGMMA
  constexpr int kN = kRows * kHeads;
  static_assert(kN >= 16 && kN <= 256 && (kN & (kN - 1)) == 0, "wgmma N of 16 to 256");
  static_assert(kWgThreads == 4 * kWarpSize, "one warpgroup of four warps");
  static_assert(kWgTile * (kWgDim / 16) % kWgThreads == 0, "whole 16-byte chunks per thread");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignSmem1024(smem_raw);
  uint8_t* q_s = smem;                                   // [kN, 128] swizzled
  uint8_t* k_s = q_s + kN * kWgDim;                      // [kStages][64, 128]
  float* ks_s = reinterpret_cast<float*>(k_s + kStages * kTileBytes);  // [kStages][64]
  float* w_s = ks_s + kStages * kWgTile;                 // [kN]
  __shared__ __align__(8) uint64_t full[kStages];       // TMA: stage filled

  // ---- this block's share of the units ----------------------------------
  const int64_t units = p.unit_end - p.unit_begin;
  const int32_t u_first = p.unit_begin + static_cast<int32_t>(units * blockIdx.x / gridDim.x);
  const int32_t u_last = p.unit_begin + static_cast<int32_t>(units * (blockIdx.x + 1) / gridDim.x);
  if (u_first == u_last) return;
  const PageLayout& l = p.layout;
  const int tid = threadIdx.x;
  auto tiles_of = [&](const LogitsUnit& u) { return (u.e_end - u.e_begin + kWgTile - 1) / kWgTile; };
  int32_t total = 0;
  for (int32_t ui = u_first; ui < u_last; ++ui) total += tiles_of(p.step.units[ui]);
  // Whole tiles sit in one page when pages are whole tiles (units and
  // groups start at multiples of 64 entries).
  const bool page_tiles = l.page_entries % kWgTile == 0;
  // Consumer gather (LogitsParams::gather_blocks): units walk pool slots.
  const bool gather = p.gather_blocks != nullptr;

  // TMA: one thread copies a whole tile (8 KiB of values in the swizzle,
  // 256 B of scales) per stage, completing on the stage's barrier.
  if (p.use_tma) {
    if (tid == 0) {
      for (int s = 0; s < kStages; ++s) MbarInit(&full[s], 1);
      FenceMbarInit();
    }
    __syncthreads();
  }

  // ---- producer: tile n of the block's stream -> stage n % kStages --------
  int32_t iu = u_first, it = 0;  // issue cursor: unit, tile in unit
  auto issue_next = [&](int32_t n) {
    if (n < total) {
      const LogitsUnit u = p.step.units[iu];
      const int32_t* block_row =
          p.step.block_table + static_cast<int64_t>(p.step.groups[u.group].seq) * p.step.max_pages;
      const int32_t base = u.e_begin + it * kWgTile;
      uint8_t* st = k_s + (n % kStages) * kTileBytes;
      if (p.use_tma) {
        if (tid == 0) {
          const EntryRef ref = LocateEntry(l, p.pool, block_row, base);  // ref.e % 64 == 0
          const int32_t page = static_cast<int32_t>((ref.page - p.pool) / l.page_bytes());
          uint64_t* bar = &full[n % kStages];
          MbarArriveExpectTx(bar, kTileBytes + kWgTile * 4);
          TmaLoad3d(st, &p.tmap, 0, ref.e, page, bar);
          BulkLoad(ks_s + (n % kStages) * kWgTile, ref.page + l.ScaleOffset(ref.e, 0), kWgTile * 4, bar);
        }
        if (++it == tiles_of(u)) {
          ++iu;
          it = 0;
        }
        return;
      }
      // Gather: the tile's rows are pool slots of the unit's one row, each
      // found through the row's pool blocks; the pool's entries bound them
      // (slots past it copy nothing and read position 0's address).
      const int32_t cap = gather ? min(u.e_end, p.gather_entries[u.row_begin]) : u.e_end;
      const int32_t* pool_row = gather ? p.gather_blocks + static_cast<int64_t>(u.row_begin) * p.gather_stride : nullptr;
      auto position = [&](int32_t slot, bool valid) {
        if (!gather) return valid ? slot : base;
        return valid ? pool_row[slot / p.gather_block] * p.gather_block + slot % p.gather_block : 0;
      };
      const EntryRef tile_ref = LocateEntry(l, p.pool, block_row, gather ? 0 : base);
#pragma unroll
      for (int j = 0; j < kWgTile * (kWgDim / 16) / kWgThreads; ++j) {
        const int q = j * kWgThreads + tid;
        const int e = q / (kWgDim / 16), c = q % (kWgDim / 16);
        const bool valid = base + e < cap;
        EntryRef ref = tile_ref;
        if (!page_tiles || gather) ref = LocateEntry(l, p.pool, block_row, position(base + e, valid));
        else if (valid) ref.e += e;
        CpAsync16(st + e * kWgDim + ((c ^ (e % 8)) * 16), ref.page + l.ValueOffset(ref.e, c * 16), valid);
      }
      if (tid < kWgTile) {
        const bool valid = base + tid < cap;
        EntryRef ref = tile_ref;
        if (!page_tiles || gather) ref = LocateEntry(l, p.pool, block_row, position(base + tid, valid));
        else if (valid) ref.e += tid;
        CpAsync4(ks_s + (n % kStages) * kWgTile + tid, ref.page + l.ScaleOffset(ref.e, 0), valid);
      }
      if (++it == tiles_of(u)) {
        ++iu;
        it = 0;
      }
    }
    CpAsyncCommit();  // empty groups keep the wait counts uniform
  };
#pragma unroll
  for (int n = 0; n < kStages - 1; ++n) issue_next(n);

  const int warp = WarpId(), lane = LaneId(), gq = lane / 4, t = lane % 4;
  const uint64_t desc_q = Sw128KMajorDesc(q_s);
  float acc[kN / 2];
#pragma unroll
  for (int j = 0; j < kN / 2; ++j) acc[j] = 0.f;
  int32_t cu = u_first, ct = 0;  // consume cursor
  int32_t staged = -1;           // group whose Q is in shared memory
  LogitsGroup g{};
  int32_t n_r[kRows];

  for (int32_t n = 0; n < total; ++n) {
    const LogitsUnit u = p.step.units[cu];
    // ---- the group's Q (rows past the group are zero) and weights ---------
    if (u.group != staged) {
      staged = u.group;
      g = p.step.groups[u.group];
      const int64_t q0 = static_cast<int64_t>(g.row_begin - p.row_base) * kHeads;
      for (int q = tid; q < kN * (kWgDim / 16); q += kWgThreads) {
        const int h = q / (kWgDim / 16), c = q % (kWgDim / 16);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (h < g.num_rows * kHeads) v = *reinterpret_cast<const uint4*>(p.q_values + (q0 + h) * kWgDim + c * 16);
        *reinterpret_cast<uint4*>(q_s + h * kWgDim + ((c ^ (h % 8)) * 16)) = v;
      }
      // Halved: the epilogue takes ReLU(x) * w as (x + |x|) * (w / 2), two
      // full-rate ops; exact, since doubling and halving are.
      for (int h = tid; h < kN; h += kWgThreads) w_s[h] = h < g.num_rows * kHeads ? 0.5f * p.weights[q0 + h] : 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        n_r[r] = r >= g.num_rows ? 0 : gather ? p.gather_entries[g.row_begin + r] : p.step.row_visible[g.row_begin + r];
      }
      FenceProxyAsyncShared();
    }
    issue_next(n + kStages - 1);
    if (p.use_tma) {
      MbarWait(&full[n % kStages], static_cast<uint32_t>(n / kStages) & 1u);
    } else {
      CpAsyncWait<kStages - 1>();
      FenceProxyAsyncShared();
    }
    __syncthreads();
    const int stage = n % kStages;
    // ---- C = K . Q^T over four k32 slices -----------------------------------
    const uint64_t desc_k = Sw128KMajorDesc(k_s + stage * kTileBytes);
    WgmmaFence();
#pragma unroll
    for (int k = 0; k < kWgDim / 32; ++k) {
      // +32 bytes per slice: +2 in the descriptor's 16-byte address units.
      WgmmaE4m3<kN>(acc, desc_k + 2 * k, desc_q + 2 * k, k);
    }
    WgmmaCommit();
    WgmmaWaitAll();
    // ---- epilogue: rows warp*16 + gq (+8); heads 8j + 2t (+1) --------------
    const int e0 = warp * 16 + gq;
    const int32_t pos0 = u.e_begin + ct * kWgTile + e0;
    const float ks0 = ks_s[stage * kWgTile + e0], ks1 = ks_s[stage * kWgTile + e0 + 8];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float2 sums = ReluWeightedHeadSums<kHeads>(acc, w_s, r, t);
      const float s0 = sums.x, s1 = sums.y;
      if (t == 0 && r < g.num_rows) {
        float* out = p.logits + static_cast<int64_t>(g.row_begin + r - p.row_base) * p.stride;
        if (pos0 < n_r[r]) out[pos0] = s0 * ks0;
        if (pos0 + 8 < n_r[r]) out[pos0 + 8] = s1 * ks1;
      }
    }
    if (++ct == tiles_of(u)) {
      ++cu;
      ct = 0;
    }
    __syncthreads();  // the stage, Q and weights may be rewritten next
  }
#endif  // INDEXER_GPU_WGMMA
}

template <int kHeads, int kRows>
absl::Status LaunchWgmma(const LogitsParams& p, Stream stream) {
  auto* kernel = &DenseLogitsWgmmaKernel<kHeads, kRows>;
  constexpr int kSmem = WgSmemBytes<kHeads, kRows>();
  // Once per device (per_device.h): the shared-memory limit and the blocks
  // per SM (host calls that would otherwise sit between the timing events).
  static PerDevice<absl::StatusOr<int>> setup;
  const absl::StatusOr<int> per_sm = setup.Get([&]() -> absl::StatusOr<int> {
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, kSmem));
    int n = 0;
    GPU_RETURN_IF_ERROR(MaxActiveBlocksPerSm(&n, kernel, kWgThreads, kSmem));
    return std::max(n, 1);
  });
  if (!per_sm.ok()) return per_sm.status();
  // Persistent: as many blocks as fit at once, each an equal share.
  const int64_t grid = std::min<int64_t>(p.unit_end - p.unit_begin, static_cast<int64_t>(*per_sm) * p.num_sms);
  GPU_LAUNCH(kernel, static_cast<int>(grid), kWgThreads, kSmem, stream, p);
  return absl::OkStatus();
}

}  // namespace

bool WgmmaTmaSupported(const PageLayout& l) {
  return l.format == KvFormat::kFp8 && l.head_dim == kWgDim && !l.tiled() &&
         l.page_entries % kWgTile == 0 && l.page_bytes() % 16 == 0;
}

bool WgmmaLogitsSupported(const LogitsParams& p, int cc_major, int cc_minor) {
  const PageLayout& l = p.layout;
  if (cc_major != 9 || cc_minor != 0) return false;  // built for sm_90a only
  if (l.format != KvFormat::kFp8 || l.head_dim != kWgDim || !MmaHeadsSupported(p.num_heads)) return false;
  if (p.max_group_rows > kMaxGroupRows) return false;
  // 16-byte value chunks and 4-byte scales, aligned, through the layout.
  if (l.page_bytes() % 16 != 0) return false;
  if (l.tiled() && l.d_per_tile % 16 != 0) return false;
  return true;
}

absl::Status LaunchDenseLogitsWgmma(const LogitsParams& p, Stream stream) {
  if (p.unit_end == p.unit_begin) return absl::OkStatus();
  if (p.gather_blocks != nullptr && (p.use_tma || p.max_group_rows != 1 || p.gather_entries == nullptr ||
                                     p.gather_block < 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "wgmma gather walk: expected groups of 1 row, no tensor map, pool entries and a block size >= 1, got ",
        p.max_group_rows, " rows, use_tma ", p.use_tma, ", block ", p.gather_block));
  }
  // Rows per block and heads -> template constants: N = rows x H heads.
  const int rows = p.max_group_rows <= 1 ? 1 : p.max_group_rows <= 2 ? 2 : 4;
  return DispatchWgmmaRows(rows, [&](auto r) {
    return DispatchMmaHeads(p.num_heads, [&](auto h) {
      return LaunchWgmma<decltype(h)::value, decltype(r)::value>(p, stream);
    });
  });
}

}  // namespace gpu
}  // namespace indexer
