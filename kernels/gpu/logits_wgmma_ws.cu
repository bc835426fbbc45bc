// Hopper (sm_90a) FP8 dense logits, warp-specialized: the decode fast path
// for linear pages of a multiple of 64 entries (the pool has a tensor map).
//
// A persistent grid; block b takes an equal contiguous share of the plan's
// work units and streams their 64-entry K tiles. One producer warp (one
// elected lane) walks the share and issues, for tile n, the bulk tensor copy
// of its 8 KiB of values (128-byte swizzle) and the bulk copy of its 64
// scales into ring slot n % kSlots, completing on the slot's `full`
// mbarrier; it waits on the slot's `empty` mbarrier before reusing it. kMath
// math warpgroups consume the ring round robin (tile n -> warpgroup n %
// kMath, so each owns kStages slots), each with its own copy of the row
// group's Q (B operand, N = kRows * 64 heads) and weights, restaged only
// when its group changes. A warpgroup releases a slot as soon as its wgmma
// has read the tile and it has the tile's scales in registers, so the
// producer refills the slot while the epilogue runs; the other warpgroups'
// wgmma and the other blocks on the SM overlap it too.
//   wgmma m64nNk32 x 4:  C[64 entries, N] = K[64, 128] . Q[N, 128]^T
//   epilogue:             logit[e] = kscale[e] * sum_h w[h] * ReLU(C[e, h])
// next_n = 2 rows of one sequence share every K tile (N = 128).
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/dispatch.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/wgmma_sm90.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kWsTile = 64;     // entries per K tile (wgmma M)
constexpr int kWsDim = 128;     // D: one 128-byte swizzle row per entry
constexpr int kWsHeads = 64;    // H
constexpr int kWsTileBytes = kWsTile * kWsDim;
constexpr int kWsScaleBytes = kWsTile * 4;
constexpr int kWgSize = 4 * kWarpSize;  // a warpgroup: four warps

template <int kRows, int kMath, int kStages>
struct WsConfig {
  static constexpr int kN = kRows * kWsHeads;            // wgmma N
  static constexpr int kSlots = kMath * kStages;         // ring slots
  static constexpr int kThreads = kMath * kWgSize + kWarpSize;  // + producer warp
  static constexpr int kQBytes = kN * kWsDim;            // one warpgroup's Q
  // Shared memory from a 1024-byte aligned base: K slots | Q per warpgroup
  // (both in the 128-byte swizzle, 1024-byte aligned) | scales per slot |
  // weights per warpgroup | alignment slack.
  static constexpr int kOffQ = kSlots * kWsTileBytes;
  static constexpr int kOffScale = kOffQ + kMath * kQBytes;
  static constexpr int kOffW = kOffScale + kSlots * kWsScaleBytes;
  static constexpr int kSmem = kOffW + kMath * kN * 4 + 1024;
  // Blocks per SM the register cap is set for (shared memory allows them).
  static constexpr int kMinBlocks = kRows == 1 ? 3 : 2;

  static_assert(kN == 64 || kN == 128, "wgmma N of 64 or 128 (kRows 1 or 2)");
  static_assert(kMath >= 1 && kMath <= 4, "1..4 math warpgroups (named barriers 1..kMath)");
  static_assert(kStages >= 2, "at least double-buffered per warpgroup");
  static_assert(kOffQ % 1024 == 0 && kQBytes % 1024 == 0, "swizzled tiles 1024-byte aligned");
  static_assert(kOffScale % 16 == 0, "bulk copies land 16-byte aligned");
  static_assert(kSmem <= 227 * 1024, "fits one block's shared memory");
};

template <int kRows, int kMath, int kStages>
__global__ void __launch_bounds__((WsConfig<kRows, kMath, kStages>::kThreads),
                                  (WsConfig<kRows, kMath, kStages>::kMinBlocks))
    DenseLogitsWgmmaWsKernel(const INDEXER_GRID_CONSTANT LogitsParams p) {
#if INDEXER_GPU_WGMMA
  using C = WsConfig<kRows, kMath, kStages>;
  constexpr int kN = C::kN, kSlots = C::kSlots;
  static_assert(kWgSize == 128, "wgmma runs on warpgroups of 128 threads");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* k_s = smem;                                            // [kSlots][64, 128]
  float* ks_s = reinterpret_cast<float*>(smem + C::kOffScale);   // [kSlots][64]
  __shared__ __align__(8) uint64_t full[kSlots];   // producer -> warpgroup
  __shared__ __align__(8) uint64_t empty[kSlots];  // warpgroup -> producer

  // ---- this block's share of the units ----------------------------------
  const int64_t units = p.unit_end - p.unit_begin;
  const int32_t u_first = p.unit_begin + static_cast<int32_t>(units * blockIdx.x / gridDim.x);
  const int32_t u_last = p.unit_begin + static_cast<int32_t>(units * (blockIdx.x + 1) / gridDim.x);
  if (u_first == u_last) return;
  const int tid = threadIdx.x, warp = WarpId(), lane = LaneId();
  auto tiles_of = [](const LogitsUnit& u) { return (u.e_end - u.e_begin + kWsTile - 1) / kWsTile; };
  int32_t total = 0;
  for (int32_t ui = u_first; ui < u_last; ++ui) total += tiles_of(p.step.units[ui]);
  if (tid == 0) {
    for (int s = 0; s < kSlots; ++s) {
      MbarInit(&full[s], 1);                    // the producer's expect_tx
      MbarInit(&empty[s], kWgSize / kWarpSize); // one arrival per consumer warp
    }
    FenceMbarInit();
  }
  __syncthreads();  // the last block-wide barrier: the roles part here

  // ---- producer: tile n -> slot n % kSlots ---------------------------------
  if (warp == kMath * (kWgSize / kWarpSize)) {
    if (lane != 0) return;
    const PageLayout& l = p.layout;
    int32_t iu = u_first, it = 0;
    LogitsUnit u = p.step.units[iu];
    const int32_t* block_row =
        p.step.block_table + static_cast<int64_t>(p.step.groups[u.group].seq) * p.step.max_pages;
    for (int32_t n = 0; n < total; ++n) {
      const int slot = n % kSlots;
      // Tile n - kSlots was the slot's last use: its release is completion
      // n / kSlots - 1 of `empty`.
      if (n >= kSlots) MbarWait(&empty[slot], static_cast<uint32_t>(n / kSlots + 1) & 1u);
      // Units and groups start at multiples of 64 entries and pages hold
      // whole tiles, so a tile is one box of one page.
      const EntryRef ref = LocateEntry(l, p.pool, block_row, u.e_begin + it * kWsTile);
      const int32_t page = static_cast<int32_t>((ref.page - p.pool) / l.page_bytes());
      MbarArriveExpectTx(&full[slot], kWsTileBytes + kWsScaleBytes);
      TmaLoad3d(k_s + slot * kWsTileBytes, &p.tmap, 0, ref.e, page, &full[slot]);
      BulkLoad(ks_s + slot * kWsTile, ref.page + l.ScaleOffset(ref.e, 0), kWsScaleBytes, &full[slot]);
      if (++it == tiles_of(u) && ++iu < u_last) {
        it = 0;
        u = p.step.units[iu];
        block_row = p.step.block_table + static_cast<int64_t>(p.step.groups[u.group].seq) * p.step.max_pages;
      }
    }
    return;
  }

  // ---- math warpgroup wg: tiles wg, wg + kMath, ... -------------------------
  const int wg = warp / (kWgSize / kWarpSize);
  const int wt = tid % kWgSize, wwarp = warp % (kWgSize / kWarpSize);
  const int gq = lane / 4, t = lane % 4;
  uint8_t* q_s = smem + C::kOffQ + wg * C::kQBytes;                   // [kN, 128] swizzled
  float* w_s = reinterpret_cast<float*>(smem + C::kOffW) + wg * kN;  // [kN], halved
  const uint64_t desc_q = Sw128KMajorDesc(q_s);
  float acc[kN / 2];  // written by each tile's first k-slice
  int32_t cu = u_first, ct = 0;  // cursor: unit, tile in unit
  LogitsUnit u = p.step.units[cu];
  int32_t u_tiles = tiles_of(u);
  auto advance = [&]() {
    if (++ct == u_tiles && ++cu < u_last) {
      ct = 0;
      u = p.step.units[cu];
      u_tiles = tiles_of(u);
    }
  };
  for (int i = 0; i < wg; ++i) advance();
  int32_t staged = -1;  // group whose Q this warpgroup holds
  int32_t g_rows = 0, g_row0 = 0;  // its rows; its first row in the sub-chunk
  int32_t n_r[kRows];

  for (int32_t n = wg; n < total; n += kMath) {
    // ---- the group's Q (rows past the group are zero) and weights ---------
    if (u.group != staged) {
      NamedBarrierSync(1 + wg, kWgSize);  // every warp is done with the old Q
      staged = u.group;
      const LogitsGroup g = p.step.groups[u.group];
      g_rows = g.num_rows;
      g_row0 = g.row_begin - p.row_base;
      const int64_t q0 = static_cast<int64_t>(g.row_begin - p.row_base) * kWsHeads;
#pragma unroll 1
      for (int q = wt; q < kN * (kWsDim / 16); q += kWgSize) {
        const int h = q / (kWsDim / 16), c = q % (kWsDim / 16);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (h < g.num_rows * kWsHeads) v = *reinterpret_cast<const uint4*>(p.q_values + (q0 + h) * kWsDim + c * 16);
        *reinterpret_cast<uint4*>(q_s + h * kWsDim + ((c ^ (h % 8)) * 16)) = v;
      }
      // Halved: ReLU(x) * w is taken as (x + |x|) * (w / 2), two full-rate
      // ops; exact, since doubling and halving are.
      for (int h = wt; h < kN; h += kWgSize) w_s[h] = h < g.num_rows * kWsHeads ? 0.5f * p.weights[q0 + h] : 0.f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) n_r[r] = r < g.num_rows ? p.step.row_visible[g.row_begin + r] : 0;
      FenceProxyAsyncShared();            // Q stores before the wgmma reads
      NamedBarrierSync(1 + wg, kWgSize);
    }
    const int slot = n % kSlots;
    MbarWait(&full[slot], static_cast<uint32_t>(n / kSlots) & 1u);
    // ---- C = K . Q^T over four k32 slices -----------------------------------
    const uint64_t desc_k = Sw128KMajorDesc(k_s + slot * kWsTileBytes);
    WgmmaFence();
#pragma unroll
    for (int k = 0; k < kWsDim / 32; ++k) {
      // +32 bytes per slice: +2 in the descriptor's 16-byte address units.
      if constexpr (kN == 64) {
        if (k == 0) WgmmaE4m3N64First(acc, desc_k, desc_q);
        else WgmmaE4m3N64(acc, desc_k + 2 * k, desc_q + 2 * k, 1);
      } else {
        if (k == 0) WgmmaE4m3N128First(acc, desc_k, desc_q);
        else WgmmaE4m3N128(acc, desc_k + 2 * k, desc_q + 2 * k, 1);
      }
    }
    WgmmaCommit();
    WgmmaWaitAll();
    // ---- release the slot, then the epilogue: rows wwarp*16 + gq (+8) -------
    const int e0 = wwarp * 16 + gq;
    const float ks0 = ks_s[slot * kWsTile + e0], ks1 = ks_s[slot * kWsTile + e0 + 8];
    __syncwarp();
    if (lane == 0) MbarArrive(&empty[slot]);
    const int32_t pos0 = u.e_begin + ct * kWsTile + e0;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float2 sums = ReluWeightedHeadSums(acc, w_s, r, t);
      const float s0 = sums.x, s1 = sums.y;
      if (r < g_rows) {
        // Every lane of the quad holds both sums: two lanes store.
        float* out = p.logits + static_cast<int64_t>(g_row0 + r) * p.stride;
        if (t == 0 && pos0 < n_r[r]) out[pos0] = s0 * ks0;
        if (t == 1 && pos0 + 8 < n_r[r]) out[pos0 + 8] = s1 * ks1;
      }
    }
#pragma unroll
    for (int i = 0; i < kMath; ++i) advance();
  }
#endif  // INDEXER_GPU_WGMMA
}

template <int kRows>
absl::Status LaunchWs(const LogitsParams& p, Stream stream) {
  // Two math warpgroups; N = 64 fits three blocks per SM (72 registers,
  // 68 KiB) with three slots each, N = 128 two blocks with four slots each.
  constexpr int kMath = 2, kStages = kRows == 1 ? 3 : 4;
  using C = WsConfig<kRows, kMath, kStages>;
  auto* kernel = &DenseLogitsWgmmaWsKernel<kRows, kMath, kStages>;
  // Once per process: the shared-memory limit and the blocks per SM (host
  // calls that would otherwise sit between the timing events).
  static const absl::StatusOr<int> per_sm = [&]() -> absl::StatusOr<int> {
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, C::kSmem));
    int n = 0;
    GPU_RETURN_IF_ERROR(MaxActiveBlocksPerSm(&n, kernel, C::kThreads, C::kSmem));
    // INDEXER_GPU_WS_BLOCKS_PER_SM caps the grid (experiments; unset in
    // production).
    const char* cap = std::getenv("INDEXER_GPU_WS_BLOCKS_PER_SM");
    if (cap != nullptr && std::atoi(cap) > 0) n = std::min(n, std::atoi(cap));
    return std::max(n, 1);
  }();
  if (!per_sm.ok()) return per_sm.status();
  // Persistent: as many blocks as fit at once, each an equal share. (A floor
  // of 2 or 4 units per block, to amortize a block's set-up at small batch,
  // measured no better: B=1 n=128k 17.2-18.9 us at 1, 17.2-17.3 at 2, 21.5 at 4.)
  const int64_t grid = std::min<int64_t>(p.unit_end - p.unit_begin, static_cast<int64_t>(*per_sm) * p.num_sms);
  GPU_LAUNCH(kernel, static_cast<int>(grid), C::kThreads, C::kSmem, stream, p);
  return absl::OkStatus();
}

}  // namespace

bool WgmmaWsSupported(const LogitsParams& p) {
  // The serial kernel keeps N = 256 (prefill groups of 4 rows): two copies
  // of a 32 KiB Q would leave one block per SM.
  return p.use_tma && p.max_group_rows <= 2 && WgmmaTmaSupported(p.layout);
}

bool WgmmaWsEnabled() {
  // INDEXER_GPU_WGMMA_WS=0 selects the serial wgmma kernel (A/B runs).
  static const bool on = [] {
    const char* v = std::getenv("INDEXER_GPU_WGMMA_WS");
    return v == nullptr || std::atoi(v) != 0;
  }();
  return on;
}

absl::Status LaunchDenseLogitsWgmmaWs(const LogitsParams& p, Stream stream) {
#if defined(INDEXER_GPU_HIP)
  (void)p, (void)stream;
  return absl::UnimplementedError("warp-specialized wgmma logits: sm_90a only");
#else
  if (p.unit_end == p.unit_begin) return absl::OkStatus();
  if (!WgmmaWsSupported(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warp-specialized wgmma logits: expected a tensor-mapped pool and groups of <= 2 rows, got ",
        p.max_group_rows, " rows, use_tma ", p.use_tma));
  }
  return DispatchWgmmaRows(p.max_group_rows <= 1 ? 1 : 2, [&](auto r) -> absl::Status {
    constexpr int kRows = decltype(r)::value;
    if constexpr (kRows <= 2) {
      return LaunchWs<kRows>(p, stream);
    } else {
      return absl::InternalError("unreachable: groups of <= 2 rows");
    }
  });
#endif
}

}  // namespace gpu
}  // namespace indexer
