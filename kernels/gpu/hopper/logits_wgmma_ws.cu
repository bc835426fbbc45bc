// Hopper (sm_90a) FP8 dense logits, warp-specialized: the fast path for
// linear pages of a multiple of 64 entries (the pool has a tensor map),
// decode and prefill groups alike.
//
// A persistent grid; block b takes an equal contiguous share of the plan's
// work units and streams their 64-entry K tiles. One producer warp walks
// the share in windows of 32 tiles (tile_window.h) and its lane 0 issues,
// for tile n, the bulk tensor copy of its 8 KiB of values (128-byte
// swizzle) and the bulk copy of its 64 scales into ring slot n % kSlots,
// completing on the slot's `full` mbarrier; it waits on the slot's `empty`
// mbarrier before reusing it.
// Each tile's facts (group, the group's rows, first entry) go with it in
// shared memory (tinfo), so the math warpgroups walk no units: their unit
// loads at every unit crossing held the consumers once the producer no
// longer walked the units just ahead of them through L1.
//
// The kMath math warpgroups form kMath / kTeam teams of kTeam warpgroups.
// Teams take the tiles round robin (tile n -> team n % teams); all kTeam
// warpgroups of a team read the SAME tile, warpgroup `role` multiplying it
// by rows role * kRowsWg .. + kRowsWg - 1 of the row group (N = kRowsWg * H
// heads; H = 16, 32 or 64, a template constant). So a group of up to
// kRowsWg * kTeam rows reads K once while each warpgroup keeps a small
// accumulator (registers for more blocks per SM), and one team's epilogue
// overlaps the other teams' and blocks' wgmma. Each warpgroup holds its own
// rows of the group's Q (B operand) and weights, restaged only when its
// group changes. A warpgroup releases a slot as soon as its wgmma has read
// the tile and it has the tile's scales in registers (the slot frees once
// every thread of the team arrived).
//   wgmma m64nNk32 x 4:  C[64 entries, N] = K[64, 128] . Q[N, 128]^T
//   epilogue:             logit[e] = kscale[e] * sum_h w[h] * ReLU(C[e, h])
// When the split top-k follows (LogitsParams::topk_hist, H 64 decode), the
// epilogue also counts each logit's top-k key in its warpgroup's shared
// histogram (the top-k's first radix digit), added to the row's global one
// when the warpgroup leaves the row: the top-k then skips its histogram
// pass over the logits (one launch instead of two).
//
// The candidate consumer's gather walk (kGather, LogitsParams::gather_*)
// runs the same math warpgroups over the pool's compact slots: tile n is
// slots [64 t, 64 t + 64) of one row, each 8-slot chunk 8 consecutive
// entries of one pool block (blocks of a multiple of 8 entries), so a chunk
// is one box of the pool's 8-entry tensor map (8 x 128 value bytes, landing
// in the tile's 128-byte swizzle exactly where the 64-entry box puts those
// rows) plus one 32-byte bulk copy of its scales. The whole producer warp
// walks: lane = (tile of a window of 4, chunk of the tile); each lane loads
// its chunk's pool block and page (two dependent loads), a window's loads
// two windows ahead of its copies. Chunks at or past the row's pool
// entries copy nothing (their rows stay stale and are never written out:
// the epilogue writes slots below gather_entries[row] alone).
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/dispatch.h"
#include "kernels/gpu/gather_logits.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/knobs.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/per_device.h"
#include "kernels/gpu/plan.h"
#include "kernels/gpu/topk_key.h"
#include "kernels/gpu/hopper/tile_window.h"
#include "kernels/gpu/hopper/trace_sm90.h"
#include "kernels/gpu/hopper/wgmma_sm90.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kWsTile = 64;     // entries per K tile (wgmma M)
static_assert(kWsTile == kWindowTile, "the producer walks tiles of TileWalk's size");
constexpr int kWsDim = 128;     // D: one 128-byte swizzle row per entry
constexpr int kWsTileBytes = kWsTile * kWsDim;
constexpr int kWsScaleBytes = kWsTile * 4;
constexpr int kWgSize = 4 * kWarpSize;  // a warpgroup: four warps

// One configuration of the kernel: index heads H, rows per warpgroup
// (wgmma N = kRowsWg x H), warpgroups per team (sharing each tile), math
// warpgroups, ring slots and the blocks per SM the register cap is set for;
// kHist: each warpgroup keeps a shared histogram of its row's top-k keys
// (LogitsParams::topk_hist) and adds it to the row's global one whenever
// its group changes; kWReg: each thread keeps its columns' weights in
// registers from the group's staging on (kN / 4 of them) and loads a tile's
// two scales before the wgmma wait, so the epilogue reads no shared memory
// (where the registers allow: at three blocks per SM H 64's one-row
// configurations without the histogram spilled, the histogram ones keep 4-8
// bytes in local memory, H 32 and 16 none).
template <int kHeads_, int kRowsWg_, int kTeam_, int kMath_, int kSlots_, int kMinBlocks_,
          bool kHist_ = false, bool kWReg_ = false>
struct WsConfig {
  static constexpr int kHeads = kHeads_;
  static constexpr int kRowsWg = kRowsWg_, kTeam = kTeam_, kMath = kMath_;
  static constexpr int kSlots = kSlots_, kMinBlocks = kMinBlocks_;
  static constexpr bool kHist = kHist_;
  static constexpr bool kWReg = kWReg_;
  static constexpr int kTeams = kMath / kTeam;
  static constexpr int kGroupRows = kRowsWg * kTeam;          // rows a group may have
  static constexpr int kN = kRowsWg * kHeads;                 // wgmma N
  static constexpr int kThreads = kMath * kWgSize + kWarpSize;  // + producer warp
  // Shared weights in WeightSlot order, two column groups per 16-byte load,
  // where the registers allow: at N = 128 (96 registers for two blocks per
  // SM) the wider loads, all hoisted, spilled 32 bytes in the tile loop.
  static constexpr bool kW4 = kN <= 64;
  static constexpr int kQBytes = kN * kWsDim;                 // one warpgroup's Q rows
  // Shared memory from a 1024-byte aligned base: K slots | Q per warpgroup
  // (both in the 128-byte swizzle, 1024-byte aligned) | scales per slot |
  // weights per warpgroup | key histogram per warpgroup (kHist) |
  // alignment slack.
  static constexpr int kOffQ = kSlots * kWsTileBytes;
  static constexpr int kOffScale = kOffQ + kMath * kQBytes;
  static constexpr int kOffW = kOffScale + kSlots * kWsScaleBytes;
  static constexpr int kOffHist = kOffW + kMath * kN * 4;
  static constexpr int kHistWords = kHist ? kTopkBins : 0;
  static constexpr int kSmem = kOffHist + kMath * kHistWords * 4 + 1024;

  static_assert(kN == 16 || kN == 32 || kN == 64 || kN == 128, "wgmma N of 16 to 128");
  static_assert(kMath >= 1 && kMath <= 4, "1..4 math warpgroups (named barriers 1..kMath)");
  static_assert(kTeam >= 1 && kMath % kTeam == 0, "whole teams");
  static_assert(kGroupRows <= kMaxGroupRows, "no more rows than a plan group holds");
  static_assert(kSlots >= 2 * kTeams, "at least double-buffered per team");
  // Tile n takes slot n % kSlots and team n % kTeams: each slot must serve
  // one team, so that a team waiting on a slot's `full` parity has itself
  // seen the phase before (with an odd ring shared by two teams a team
  // could pass a wait one phase early).
  static_assert(kSlots % kTeams == 0, "every slot serves a single team");
  static_assert(kOffQ % 1024 == 0 && kQBytes % 1024 == 0, "swizzled tiles 1024-byte aligned");
  static_assert(kOffScale % 16 == 0, "bulk copies land 16-byte aligned");
  static_assert(kSmem * kMinBlocks <= 227 * 1024, "kMinBlocks blocks fit one SM's shared memory");
  static_assert(!kHist || kRowsWg == 1, "a histogram per warpgroup holds one row");
  static_assert(!kWReg || kRowsWg == 1, "register weights for one row (kN / 4 registers)");
  static_assert(!kW4 || kHeads % 16 == 0, "the WeightSlot order pairs whole column groups");
};

// Where head h of a warpgroup's column kh = r * kHeads + h sits in its
// shared weights: lane quad t's pairs of column groups j and j + 1 (j even)
// side by side, {w[8j + 2t], w[8j + 2t + 1], w[8j + 8 + 2t], w[8j + 9 + 2t]},
// so the epilogue reads two groups' weights in one 16-byte load (the
// natural order took one 8-byte load per group: 16 per tile and warp at
// two rows).
template <int kHeads>
__host__ __device__ constexpr int WeightSlot(int kh) {
  static_assert(kHeads % 16 == 0, "pairs of whole column groups");
  const int r = kh / kHeads, h = kh % kHeads, j = h / 8;
  return r * kHeads + (j / 2) * 16 + ((h % 8) / 2) * 4 + (j % 2) * 2 + h % 2;
}

// ---- the gather walk's producer (the whole warp) ---------------------------
constexpr int kBoxEntries = 8;                     // entries per chunk (box)
constexpr int kBoxBytes = kBoxEntries * kWsDim;    // 1 KiB of values
constexpr int kBoxScaleBytes = kBoxEntries * 4;    // 32 B of scales
constexpr int kTileBoxes = kWsTile / kBoxEntries;  // 8 chunks per tile
constexpr int kWinTiles = kWarpSize / kTileBoxes;  // 4 tiles per window
// Units per claim of the claimed tail (LogitsParams::claims): two of the
// plan's 256-entry units, 8 tiles, where the tail matters.
constexpr int32_t kWsClaimUnits = 2;

// Copies every tile of the block's units [u_first, u_last) into the ring as
// the consumers take them (tile n -> slot n % kSlots, its unit facts to
// tinfo[slot]): `full` expects the bytes of the tile's chunks below the
// row's pool entries; a slot's `empty` completion is waited on before its
// reuse. Returns the tiles issued.
template <class C>
__device__ __forceinline__ int32_t GatherProducer(const LogitsParams& p, const TensorMap* rows8, int32_t u_first,
                                                  int32_t u_last, uint8_t* k_s, float* ks_s, int4* tinfo,
                                                  uint64_t* full, uint64_t* empty) {
#if INDEXER_GPU_WGMMA
  constexpr int kSlots = C::kSlots;
  const PageLayout& l = p.layout;
  const int lane = LaneId();
  const int my_tile = lane / kTileBoxes, my_box = lane % kTileBoxes;
  // The share's tiles in the consumers' order (every lane walks it alike).
  int32_t iu = u_first, it = 0;
  LogitsUnit u = p.step.units[iu];
  LogitsUnit next_u = iu + 1 < u_last ? p.step.units[iu + 1] : u;
  auto tiles_of = [](const LogitsUnit& v) { return (v.e_end - v.e_begin + kWsTile - 1) / kWsTile; };
  int32_t u_tiles = tiles_of(u);
  bool more = true;
  // A window's chunk in two steps: walked (its slot; its pool block and the
  // row's pool entries in flight), then located (its page in flight).
  struct Walked {
    int32_t tiles;  // tiles of the window (warp-uniform; 0 past the share)
    bool in;        // the lane's chunk starts inside its unit
    int32_t seq, slot, blk, cnt;
    int4 ti;        // its tile's {group, first slot, row_begin, num_rows}
  };
  struct Located {
    int32_t tiles;
    bool valid;  // the chunk holds pool entries: copy it
    int32_t page, e;
    int4 ti;
  };
  auto walk = [&](Walked& w) {
    w.tiles = 0;
    w.seq = 0;
    w.slot = 0;
    w.ti = make_int4(0, 0, 0, 0);
    int32_t row = 0, end = 0;
    bool mine = false;
#pragma unroll
    for (int j = 0; j < kWinTiles; ++j) {
      if (more) {
        if (j == my_tile) {
          mine = true;
          row = u.row_begin;
          w.seq = u.seq;
          w.slot = u.e_begin + it * kWsTile + my_box * kBoxEntries;
          end = u.e_end;
          w.ti = make_int4(u.group, u.e_begin + it * kWsTile, u.row_begin, u.num_rows);
        }
        ++w.tiles;
        if (++it == u_tiles) {
          it = 0;
          if (++iu < u_last) {
            u = next_u;
            if (iu + 1 < u_last) next_u = p.step.units[iu + 1];
            u_tiles = tiles_of(u);
          } else {
            more = false;
          }
        }
      }
    }
    // slot < end <= the row's pool size: the block index is in the row.
    w.in = mine && w.slot < end;
    w.blk = 0;
    w.cnt = 0;
    if (w.in) {
      w.cnt = p.gather_entries[row];
      w.blk = p.gather_blocks[static_cast<int64_t>(row) * p.gather_stride + w.slot / p.gather_block];
    }
  };
  auto locate = [&](const Walked& w, Located& r) {
    r.tiles = w.tiles;
    r.ti = w.ti;
    r.valid = w.in && w.slot < w.cnt;
    r.page = 0;
    r.e = 0;
    if (r.valid) {
      // 8 entries from a multiple of 8 in one block: one page (E % 64 == 0).
      const PagePos at = PagePosOf(l, w.blk * p.gather_block + w.slot % p.gather_block);
      r.page = p.step.block_table[static_cast<int64_t>(w.seq) * p.step.max_pages + at.lp];
      r.e = at.e;
    }
  };
  int32_t n = 0;  // the window's first tile
  auto issue = [&](const Located& r) {
#pragma unroll
    for (int j = 0; j < kWinTiles; ++j) {
      if (j < r.tiles) {
        const int32_t t = n + j;
        const int slot = t % kSlots;
        // Tile t - kSlots was the slot's last use: its release is completion
        // t / kSlots - 1 of `empty` (every lane waits: its copies follow).
        if (t >= kSlots) MbarWait(&empty[slot], static_cast<uint32_t>(t / kSlots + 1) & 1u);
        const bool go = r.valid && my_tile == j;
        const uint32_t boxes = __popc(__ballot_sync(0xffffffffu, go));
        if (lane == j * kTileBoxes) tinfo[slot] = r.ti;
        __syncwarp();  // the tile's facts before the arrive that releases them
        if (lane == 0) MbarArriveExpectTx(&full[slot], boxes * (kBoxBytes + kBoxScaleBytes));
        __syncwarp();  // the expected bytes before any of them land
        if (go) {
          uint8_t* dst = k_s + slot * kWsTileBytes + my_box * kBoxBytes;
          float* sdst = ks_s + slot * kWsTile + my_box * kBoxEntries;
          const uint8_t* scales = p.pool + l.PageOffset(r.page) + l.ScaleOffset(r.e, 0);
          if (p.k_evict_first) {
            TmaLoad3dHint(dst, rows8, 0, r.e, r.page, &full[slot], kL2EvictFirst);
            BulkLoadHint(sdst, scales, kBoxScaleBytes, &full[slot], kL2EvictFirst);
          } else {
            TmaLoad3d(dst, rows8, 0, r.e, r.page, &full[slot]);
            BulkLoad(sdst, scales, kBoxScaleBytes, &full[slot]);
          }
        }
      }
    }
    n += r.tiles;
  };
  // Window i's copies go out while window i + 1's pages and window i + 2's
  // pool blocks are in flight.
  Walked a;
  Located b, c;
  walk(a);
  locate(a, b);
  walk(a);
  while (b.tiles > 0) {
    locate(a, c);
    walk(a);
    issue(b);
    b = c;
  }
  return n;
#else
  (void)p, (void)rows8, (void)u_first, (void)u_last, (void)k_s, (void)ks_s, (void)tinfo, (void)full, (void)empty;
  return 0;
#endif  // INDEXER_GPU_WGMMA
}

// f(std::integral_constant<int, wg>{}) for the run-time warpgroup index
// wg in [kI, kCount): each warpgroup runs its own instantiation.
template <int kI, int kCount, class F>
__device__ __forceinline__ void ForWarpgroup(int wg, F& f) {
  if constexpr (kI + 1 < kCount) {
    if (wg == kI) {
      f(std::integral_constant<int, kI>{});
    } else {
      ForWarpgroup<kI + 1, kCount>(wg, f);
    }
  } else {
    f(std::integral_constant<int, kI>{});
  }
}

// kGather: the consumer's gather walk; `rows8` is the pool's tensor map of
// 8-entry boxes (unused otherwise).
template <class C, bool kGather>
__global__ void __launch_bounds__(C::kThreads, C::kMinBlocks)
    DenseLogitsWgmmaWsKernel(const INDEXER_GRID_CONSTANT LogitsParams p,
                             const INDEXER_GRID_CONSTANT TensorMap rows8) {
#if INDEXER_GPU_WGMMA
  constexpr int kN = C::kN, kSlots = C::kSlots, kTeams = C::kTeams, kRowsWg = C::kRowsWg;
  constexpr int kHeads = C::kHeads;
  constexpr int kWarpsWg = kWgSize / kWarpSize;
  static_assert(kWgSize == 128, "wgmma runs on warpgroups of 128 threads");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignSmem1024(smem_raw);
  uint8_t* k_s = smem;                                            // [kSlots][64, 128]
  float* ks_s = reinterpret_cast<float*>(smem + C::kOffScale);   // [kSlots][64]
  // The ring's barriers and tile facts, one shared object: the math
  // warpgroups address it from one register (ring_a below).
  struct Ring {
    uint64_t full[kSlots];   // producer -> team
    uint64_t empty[kSlots];  // team -> producer
    // Per slot, written by the producer before the arrive that starts its
    // copies: the tile's {group, first entry, the group's first row, its
    // rows}; group -1 ends the team's walk. The consumers walk no units.
    int4 tinfo[kSlots];
  };
  __shared__ __align__(16) Ring ring;
  uint64_t* full = ring.full;
  uint64_t* empty = ring.empty;
  int4* tinfo = ring.tinfo;

  // ---- this block's share of the units (with a claimed tail: of those
  // before it; the default rule leaves every block some) -------------------
  const int64_t units = p.unit_end - p.unit_begin - p.tail_units;
  const int32_t u_first = p.unit_begin + static_cast<int32_t>(units * blockIdx.x / gridDim.x);
  const int32_t u_last = p.unit_begin + static_cast<int32_t>(units * (blockIdx.x + 1) / gridDim.x);
  // (With a tail every block claims, its own share empty or not.)
  if (u_first == u_last && p.tail_units == 0) return;
  // Lane arithmetic from the unsigned thread index: lane / 4 and lane % 4
  // are a shift and a mask (from a signed index the compiler emitted a
  // sign fix-up sequence).
  const uint32_t utid = threadIdx.x;
  const int tid = static_cast<int>(utid), warp = static_cast<int>(utid / kWarpSize);
  const int lane = static_cast<int>(utid % kWarpSize);
  // The bench's timeline (trace_sm90.h): thread 0 (the math side's traced
  // thread) and the copy warp's lane 0; null otherwise and untraced.
  auto trace = [&](bool mine) { return mine ? TraceRecord(p.trace, p.trace_blocks) : nullptr; };
  if (tid == 0) {
    TraceEntry(trace(true));
    for (int s = 0; s < kSlots; ++s) {
      MbarInit(&full[s], 1);                    // the producer's expect_tx
      MbarInit(&empty[s], C::kTeam * kWgSize);  // one arrival per team thread
    }
    FenceMbarInit();
  }
  const bool hist = C::kHist && p.topk_hist != nullptr;
  if (hist) {
    uint32_t* h = reinterpret_cast<uint32_t*>(smem + C::kOffHist);
    for (int b = tid; b < C::kMath * C::kHistWords; b += C::kThreads) h[b] = 0;
  }
  __syncthreads();  // the last block-wide barrier: the roles part here
  if (p.launch_dependents) AllowDependentLaunch();

  // ---- producer: tile n -> slot n % kSlots ---------------------------------
  if (warp == C::kMath * kWarpsWg) {
    // After the share's last tile, one end mark per team (lane 0).
    auto finish = [&](int32_t n) {
      if (lane != 0) return;
      for (int k = 0; k < kTeams; ++k, ++n) {
        const int slot = n % kSlots;
        if (n >= kSlots) MbarWait(&empty[slot], static_cast<uint32_t>(n / kSlots + 1) & 1u);
        tinfo[slot] = make_int4(-1, 0, 0, 0);
        MbarArrive(&full[slot]);  // the phase completes with no bytes
      }
    };
    if constexpr (kGather) {
      finish(GatherProducer<C>(p, &rows8, u_first, u_last, k_s, ks_s, tinfo, full, empty));
      TraceCopyEnd(trace(lane == 0));
      return;
    }
    // The whole warp looks its tiles up a window of 32 at a time (TileWalk,
    // tile_window.h), the next window's block-table loads in flight while
    // lane 0 issues this one's copies from registers. (Walked one tile
    // ahead by lane 0 alone, each tile's table entry and every unit load
    // sat between two copies: the walk bound the kernel, H200 ncu at B=64
    // 32k.) Pages hold whole tiles and units start at multiples of 64
    // entries, so a tile is one box of one page.
    const PageLayout& l = p.layout;
    int32_t n = 0;  // the next tile to issue
    // Tile n from its page and entry (lane 0).
    auto copy = [&](int32_t page, int32_t e, const void* sc, const int4& ti) {
      const int slot = n % kSlots;
      tinfo[slot] = ti;  // released by the arrive
      MbarArriveExpectTx(&full[slot], kWsTileBytes + kWsScaleBytes);
      if (p.k_evict_first) {
        TmaLoad3dHint(k_s + slot * kWsTileBytes, &p.tmap, 0, e, page, &full[slot], kL2EvictFirst);
        BulkLoadHint(ks_s + slot * kWsTile, sc, kWsScaleBytes, &full[slot], kL2EvictFirst);
      } else {
        TmaLoad3d(k_s + slot * kWsTileBytes, &p.tmap, 0, e, page, &full[slot]);
        BulkLoad(ks_s + slot * kWsTile, sc, kWsScaleBytes, &full[slot]);
      }
    };
    // The whole warp waits for tile n's slot (tile n - kSlots was its last
    // use: its release is completion n / kSlots - 1 of `empty`); why the
    // whole warp: tile_window.h.
    auto wait_slot = [&]() {
      if (n >= kSlots) {
        TraceCopyWait(p.trace != nullptr, trace(lane == 0),
                      [&] { MbarWait(&empty[n % kSlots], static_cast<uint32_t>(n / kSlots + 1) & 1u); });
      }
    };
    auto lead = [&](const TileWindow& w) -> int {
      if (w.lead < 0 || w.count == 0) return 0;
      wait_slot();
      if (lane == 0) {
        copy(w.lead, w.e, p.pool + l.PageOffset(w.lead) + l.ScaleOffset(w.e, 0),
             make_int4(w.group, w.first, w.row_begin, w.num_rows));
      }
      ++n;
      return 1;
    };
    auto rest = [&](const TileWindow& w, int i) {
      if (i >= w.count) return;
      const uint64_t scales = reinterpret_cast<uint64_t>(p.pool + l.PageOffset(w.page) + l.ScaleOffset(w.e, 0));
      for (; i < w.count; ++i, ++n) {
        const int32_t page = ShflIdx(w.page, i), e = ShflIdx(w.e, i);
        const void* sc = reinterpret_cast<const void*>(ShflIdx(scales, i));
        const int4 ti = make_int4(ShflIdx(w.group, i), ShflIdx(w.first, i), ShflIdx(w.row_begin, i),
                                  ShflIdx(w.num_rows, i));
        wait_slot();
        if (lane == 0) copy(page, e, sc, ti);
      }
    };
    if (u_first < u_last) {
      TileWalk walk(p, u_first, u_last);
      WalkWindows(walk, lead, rest);
    }
    // The claimed tail: kWsClaimUnits at a time, the next claim sent before
    // the claimed units are walked (its answer waits in lane 0's register).
    if (p.tail_units > 0) {
      const int32_t t0 = p.unit_end - p.tail_units;
      int32_t sent = 0;
      if (lane == 0) sent = atomicAdd(p.claims, 1);
      for (;;) {
        const int64_t ub = t0 + int64_t{ShflIdx(sent, 0)} * kWsClaimUnits;
        if (ub >= p.unit_end) break;
        if (lane == 0) sent = atomicAdd(p.claims, 1);
        const int64_t ue = ub + kWsClaimUnits < p.unit_end ? ub + kWsClaimUnits : p.unit_end;
        TileWalk more(p, static_cast<int32_t>(ub), static_cast<int32_t>(ue));
        WalkWindows(more, lead, rest);
      }
      // The launch's last block sets the counters back for the next launch
      // (every block's claims came back before it counts itself done).
      if (lane == 0) {
        __threadfence();
        if (atomicAdd(p.claims + 1, 1) == static_cast<int32_t>(gridDim.x) - 1) {
          atomicExch(p.claims, 0);
          atomicExch(p.claims + 1, 0);
        }
      }
    }
    finish(n);
    TraceCopyEnd(trace(lane == 0));
    return;
  }

  // ---- math warpgroup wg: team wg / kTeam takes tiles team, team + kTeams, ..
  // In the dense walk, instantiated per warpgroup (ForWarpgroup below: wg
  // by a shuffle from lane 0, then a branch to wg's copy), so that wg, its
  // team and role are constants: its shared addresses (Q, weights,
  // histogram) fold into immediates. The wgmma descriptors are carried as
  // their low words (Sw128DescLo), the high word an immediate, with the
  // slot's offset one add. With the lane arithmetic from the unsigned
  // thread index, the next_n 2 tile's path went from ~191 to ~171 warp
  // instructions (SASS, s36; ncu of s35 had counted the lane's quad
  // rematerialized from the signed index, 14, and both descriptors rebuilt
  // from the shared base, ~40). ptxas still rebuilds the descriptors at
  // every tile (~30: at the 72-register cap it rematerializes rather than
  // keep them). H100, s36, against the per-block copy: prefill 4k / 16k x
  // 32k logits -1.8 % (1017 -> 1034-1038 TFLOP/s), next_n 2 decode layers
  // -0.9 to -2.3 us, the rest within noise (h100_2026-12-07_s36.md).
  auto consume = [&](auto wg_c) {
    const int wg = wg_c;  // a constant in the dense walk's instantiations
    const int team = wg / C::kTeam, role = wg % C::kTeam;
    const int wt = static_cast<int>(utid % kWgSize), wwarp = warp % kWarpsWg;
    const int gq = static_cast<int>((utid % kWarpSize) / 4), t = static_cast<int>(utid % 4);
    uint8_t* q_s = smem + C::kOffQ + wg * C::kQBytes;                   // [kN, 128] swizzled
    // [kN], halved (kW4: WeightSlot order); unused where kWReg
    [[maybe_unused]] float* w_s = reinterpret_cast<float*>(smem + C::kOffW) + wg * kN;
    const uint32_t dq_lo = Sw128DescLo(SmemAddr(q_s));
    const uint32_t dk_lo = Sw128DescLo(SmemAddr(k_s));  // slot 0's tile
    // The ring's shared address, opaque to the compiler: held in a register
    // (it otherwise rebuilt the address from the block's cluster id at every
    // use, ~12 instructions per tile and warp). The barriers' addresses come
    // from it; the tile facts' load at each tile still rebuilds its address
    // from the cluster id (5 instructions, SASS of s36).
    uint32_t ring_a = SmemAddr(&ring);
    asm volatile("" : "+r"(ring_a));
    const uint32_t full_a = ring_a + offsetof(Ring, full), empty_a = ring_a + offsetof(Ring, empty);
    uint32_t* hist_s = reinterpret_cast<uint32_t*>(smem + C::kOffHist) + wg * C::kHistWords;  // [2048]
    int32_t staged = -1;            // group whose Q this warpgroup holds
    int32_t my_rows = 0, row0 = 0;  // its rows of that group; the first (sub-chunk row)
    float* out0 = p.logits;         // row0's logits
    int32_t n_r[kRowsWg] = {};
    const int e0 = wwarp * 16 + gq;  // the thread's entries e0, e0 + 8 of a tile
    // The thread's share of a tile's logits (QuadTransposedSums): row
    // lane_row of the warpgroup's, entry e_lane (kBoth: e0 and e0 + 8); at
    // one row lanes t < 2 write. lane_out and lane_n (0: nothing to write)
    // are the row's, set at each stage.
    constexpr bool kBoth = kRowsWg == 4;
    const int lane_row = kRowsWg == 4 ? t : kRowsWg == 2 ? t >> 1 : 0;
    const int e_lane = kBoth ? e0 : e0 + 8 * (t & 1);
    const bool lane_writes = kRowsWg > 1 || t < 2;
    float* lane_out = p.logits;
    int32_t lane_n = 0;
    // kWReg: the thread's (halved) weights, columns 8 j + 2 t, + 1.
    [[maybe_unused]] float2 w_r[C::kWReg ? kN / 8 : 1];  // unused unless kWReg

    // ---- the old group's histogram to its row's global one, zeroed --------
    // REQUIRES: the warpgroup's barrier after its last epilogue of the group.
    auto flush = [&]() {
      const bool keep = my_rows > 0 && n_r[0] > p.topk_min_visible;
      uint32_t* g = p.topk_hist + static_cast<int64_t>(row0) * kTopkStateWords;
      for (int b = wt; b < kTopkBins; b += kWgSize) {
        const uint32_t c = hist_s[b];
        if (c != 0) {
          if (keep) atomicAdd(g + b, c);
          hist_s[b] = 0;
        }
      }
    };
    // ---- this warpgroup's rows of the cursor's group (zero past the group) --
    auto stage = [&](int32_t group, int32_t row_begin, int32_t num_rows) {
      NamedBarrierSync(1 + wg, kWgSize);  // every warp is done with the old Q
      if (hist && staged >= 0) flush();   // (the barrier below orders its zeroing)
      staged = group;
      // The group's rows ride in the unit: the Q load waits on no group load.
      const int32_t first = role * kRowsWg;  // the group's row this warpgroup starts at
      my_rows = min(max(num_rows - first, 0), kRowsWg);
      row0 = row_begin + first - p.row_base;
      out0 = p.logits + static_cast<int64_t>(row0) * p.stride;
      // Q by cp.async (no registers held), then the weights and the rows'
      // lengths, all in flight at once: one round trip a stage, not one per
      // 16-byte chunk (a stage sits between two tiles of the warpgroup's
      // stream; at B=64 x 8k each warpgroup stages about twice in ten tiles).
      const int32_t* visible = kGather ? p.gather_entries : p.step.row_visible;
      if (my_rows > 0) {
        const int64_t q0 = static_cast<int64_t>(row0) * kHeads;
        static_assert(kN <= kWgSize, "a weight per thread");
#pragma unroll 1
        for (int q = wt; q < kN * (kWsDim / 16); q += kWgSize) {
          const int h = q / (kWsDim / 16), c = q % (kWsDim / 16);
          const bool valid = h < my_rows * kHeads;
          CpAsync16(q_s + h * kWsDim + ((c ^ (h % 8)) * 16),
                    valid ? p.q_values + (q0 + h) * kWsDim + c * 16 : p.q_values, valid);
        }
        CpAsyncCommit();
        // Halved: ReLU(x) * w is taken as (x + |x|) * (w / 2), two full-rate
        // ops; exact, since doubling and halving are.
        // kWReg: straight into the thread's registers (columns 8 j + 2 t, + 1).
        // (One row a warpgroup: all kN = H columns are the row's heads.)
        if constexpr (C::kWReg) {
          const float* w = p.weights + q0 + 2 * t;
#pragma unroll
          for (int j = 0; j < kN / 8; ++j) w_r[j] = make_float2(0.5f * w[j * 8], 0.5f * w[j * 8 + 1]);
        } else {
          if (wt < kN) {
            w_s[C::kW4 ? WeightSlot<kHeads>(wt) : wt] = wt < my_rows * kHeads ? 0.5f * p.weights[q0 + wt] : 0.f;
          }
        }
#pragma unroll
        for (int r = 0; r < kRowsWg; ++r) n_r[r] = r < my_rows ? visible[p.row_base + row0 + r] : 0;
        lane_n = 0;
#pragma unroll
        for (int r = 0; r < kRowsWg; ++r) {
          if (r == lane_row && lane_writes) lane_n = n_r[r];  // 0 past my_rows
        }
        lane_out = lane_row < my_rows ? out0 + lane_row * p.stride : out0;
        CpAsyncWait<0>();
      } else {
#pragma unroll
        for (int r = 0; r < kRowsWg; ++r) n_r[r] = 0;
        lane_n = 0;
      }
      FenceProxyAsyncShared();            // Q stores before the wgmma reads
      NamedBarrierSync(1 + wg, kWgSize);
    };
    // ---- C = K . Q^T over four k32 slices (issued; the caller waits) --------
    auto mma = [&](float (&acc)[kN / 2], int slot) {
      const uint32_t k_lo = dk_lo + static_cast<uint32_t>(slot) * (kWsTileBytes >> 4);
      WgmmaFence();
#pragma unroll
      for (int k = 0; k < kWsDim / 32; ++k) {
        // +32 bytes per slice: +2 in the descriptor's 16-byte address units.
        if (k == 0) WgmmaE4m3First<kN>(acc, Sw128DescOfLo(k_lo), Sw128DescOfLo(dq_lo));
        else WgmmaE4m3<kN>(acc, Sw128DescOfLo(k_lo + 2 * k), Sw128DescOfLo(dq_lo + 2 * k), 1);
      }
      WgmmaCommit();
    };
    // ---- release the slot (its wgmma done), then the epilogue ---------------
    // Every thread arrives after its own reads of the slot: with one arrival
    // per warp after __syncwarp, compute-sanitizer racecheck reported a WAR
    // hazard between the other lanes' scale reads and the slot's next bulk
    // copy once slots were reused (prefill shapes); per-thread arrivals are
    // clean there and measured no slower (B=64 32k next_n 1: 93.1-93.5 us
    // vs 93.2-94.3; prefill 4k x 32k: 2772 vs 2837 us; next_n 2: 136.5 vs
    // 131.6).
    // kWReg: the scales come loaded (ks0: entry e_lane's; kBoth: ks1, e0 +
    // 8's), before the wgmma wait. The quad's partial sums are reduced
    // transposed (QuadTransposedSums: each lane ends with its own share, not
    // every sum), so that each lane writes its logits at a precomputed row
    // with one scale. H100, same call, against every sum in every lane and
    // two writing lanes per row (s29, three rounds): prefill 4k x 32k logits
    // 2137 -> 2060 us (964.7 -> 1000.7 TFLOP/s), 16k x 32k 6857 -> 6611;
    // decode within 1 us either way (bound by K's bytes).
    auto epilogue = [&](const float (&acc)[kN / 2], int slot, int32_t tile0, float ks0, float ks1) {
      if constexpr (!C::kWReg) {
        ks0 = ks_s[slot * kWsTile + e_lane];
        if constexpr (kBoth) ks1 = ks_s[slot * kWsTile + e0 + 8];
      }
      MbarArrive(empty_a + 8 * slot);
      float2 part[kRowsWg];
#pragma unroll
      for (int r = 0; r < kRowsWg; ++r) {
        if constexpr (C::kWReg) {
          part[r] = ReluWeightedHeadPartialsReg<kHeads>(acc, w_r);
        } else if constexpr (C::kW4) {
          part[r] = ReluWeightedPartials<kHeads / 8>(acc + 4 * r * (kHeads / 8), [&](int j) {
            // Column groups j and j + 1 (j even) in one 16-byte load.
            const float4 w4 = *reinterpret_cast<const float4*>(w_s + r * kHeads + (j / 2) * 16 + 4 * t);
            return j % 2 == 0 ? make_float2(w4.x, w4.y) : make_float2(w4.z, w4.w);
          });
        } else {
          part[r] = ReluWeightedHeadPartials<kHeads>(acc, w_s, r, t);
        }
      }
      const float2 v = QuadTransposedSums<kRowsWg>(part, t);
      const int32_t pos = tile0 + e_lane;
      if (pos < lane_n) {
        const float x = v.x * ks0;
        lane_out[pos] = x;
        // One shared atomic per logit. Combined first (the quad's two logits
        // of one bin in one atomic, or one atomic per distinct bin of the
        // warp by match.any) they measured slower, not faster: H200, s38,
        // three rounds, logits next_n 2 B=64 x 32k +1.2 / +8.4 us, B=128 x
        // 128k +17 / +57, next_n 1 within 1 us (h200_2026-12-07_s38.md).
        if (hist) atomicAdd(&hist_s[TopBin(OrderedKey(x))], 1u);
      }
      if constexpr (kBoth) {
        if (pos + 8 < lane_n) lane_out[pos + 8] = v.y * ks1;
      }
    };
    // Even a warpgroup with no rows in the group waits for the tile: its
    // release must count toward this use of the slot, not the previous one.
    auto skip = [&](int slot) { MbarArrive(empty_a + 8 * slot); };

    // ---- one tile at a time: wait, multiply, epilogue ------------------------
    // The team's first tile: when it lies in the share's first unit its group
    // is staged before the wait (its Q load beside the tile's); every later
    // group change is staged from the slot's facts, the tile waiting in it.
    if (u_first < u_last) {
      const LogitsUnit u = p.step.units[u_first];
      if ((u.e_end - u.e_begin + kWsTile - 1) / kWsTile > team) stage(u.group, u.row_begin, u.num_rows);
    }
    float acc[kN / 2];  // written by each tile's first k-slice
    // Tile n = team, team + kTeams, ... in slot n % kSlots, its `full` phase
    // (n / kSlots) & 1, both carried (kTeams divides kSlots: a wrap is one phase).
    int slot = team;
    uint32_t phase = 0;
    for (;; slot += kTeams) {
      if (slot >= kSlots) {
        slot -= kSlots;
        phase ^= 1u;
      }
      TraceMathWait(p.trace != nullptr, trace(tid == 0), [&] { MbarWait(full_a + 8 * slot, phase); });
      const int4 ti = LdsInt4(ring_a + offsetof(Ring, tinfo) + 16 * slot);  // read before the slot's release
      if (ti.x < 0) {               // the share's end
        TraceEndMark(trace(tid == 0));
        break;
      }
      if (ti.x != staged) stage(ti.x, ti.z, ti.w);
      if (my_rows == 0) {
        skip(slot);
      } else {
        mma(acc, slot);
        float ks0 = 0.f, ks1 = 0.f;
        if constexpr (C::kWReg) {  // their loads in flight during the wgmma
          ks0 = ks_s[slot * kWsTile + e_lane];
          if constexpr (kBoth) ks1 = ks_s[slot * kWsTile + e0 + 8];
        }
        WgmmaWaitAll();
        epilogue(acc, slot, ti.y, ks0, ks1);
      }
      TraceScored(p.trace != nullptr, trace(tid == 0));
    }
    if (hist && staged >= 0) {
      NamedBarrierSync(1 + wg, kWgSize);  // every warp's last epilogue done
      flush();
    }
    TraceMathEnd(trace(tid == 0));
  };
  // (The gather walk keeps one copy for every warpgroup, wg a register:
  // per-warpgroup copies measured slower there, H100 s36: V4.1 consumer
  // B=64 x 32k logits 69.2-69.5 -> 72.5-75.2 us. This one copy measured
  // 72.2-72.3 against 69.1 for b5bda53's kernel, whose consumer was written
  // in place (H100 s37), and 72.1-72.6 with b5bda53's signed lanes and
  // 64-bit descriptors restored (f513be4). The tile loop is no longer (218
  // SASS instructions against 222); the kernel has 112 more, mostly
  // register copies in the producer's unit walk, whose PTX already differs:
  // the cost is in how the kernel around the lambda compiles.)
  if constexpr (kGather) {
    consume(ShflIdx(warp / kWarpsWg, 0));
  } else {
    ForWarpgroup<0, C::kMath>(ShflIdx(warp / kWarpsWg, 0), consume);
  }
#endif  // INDEXER_GPU_WGMMA
}

// INDEXER_GPU_TOPK_FUSE=0 keeps the histogram out of the epilogue (the
// top-k then runs its own first pass; A/B runs; knobs.h).
bool TopkFuseEnabled() { return Knobs().topk_fuse; }

// kGather: the gather walk over the pool's 8-entry tensor map `rows8`
// (the dense walk passes its own map, unused).
template <class C, bool kGather = false>
absl::Status LaunchWs(const LogitsParams& p_in, Stream stream, const TensorMap& rows8) {
  auto* kernel = &DenseLogitsWgmmaWsKernel<C, kGather>;
  LogitsParams p = p_in;
  if (kGather || !C::kHist || !TopkFuseEnabled()) p.topk_hist = nullptr;
  // Where K is read once (every sequence's rows fit one group: decode), its
  // copies carry the L2 evict-first policy, so the logits the top-k reads
  // next (and what other layers keep in L2) stay. Same call, H200
  // (h200_2026-12-01_kfp8.md): logits -6.4 us at B=64 8k, -2.2 at B=8 32k,
  // -0.8 at B=64 32k, noise elsewhere; top-k -1.4 to -2.6 us at B=64/128 x
  // 32k and B=64 x 128k. A prefill chunk's groups each read the sequence's
  // whole K: there the hint evicted the lines the next group reads (4k x
  // 32k: 2163 us with it, 2125-2131 without; h200_2026-12-04_s19.md). Nor
  // where the step's logits are more than the L2 holds: the lines the hint
  // would keep for the top-k cannot all stay, and at B=128 x 128k (64 MiB
  // of logits, more than the H200's L2) the hint cost 5-6 us of logits in
  // two calls and gave back 0.6 us of top-k (570.3-572.6 us with it,
  // 565.2-566.6 without; h200_2026-12-04_s19.md, s19-6 and s19-7). (The
  // step's rows bound the sub-chunk's; a decode step splits only past the
  // logits budget, far above any L2.) Env INDEXER_GPU_WS_EVICT_FIRST=0
  // turns it off everywhere, =2 drops the L2 bound (A/B runs).
  const int64_t logits_bytes = int64_t{p.step.num_rows} * p.stride * 4;
  const int32_t mode = Knobs().ws_evict_first;
  p.k_evict_first = mode != 0 && int64_t{p.step.num_rows} <= int64_t{p.step.num_seqs} * p.max_group_rows &&
                    (mode == 2 || p.l2_bytes <= 0 || logits_bytes <= p.l2_bytes);
  p.launch_dependents = Knobs().logits_pdl;
  // Once per device and configuration (per_device.h): the shared-memory
  // limit and the blocks per SM (host calls that would otherwise sit between
  // the timing events).
  static PerDevice<absl::StatusOr<int>> setup;
  const absl::StatusOr<int> per_sm = setup.Get([&]() -> absl::StatusOr<int> {
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, C::kSmem));
    int n = 0;
    GPU_RETURN_IF_ERROR(MaxActiveBlocksPerSm(&n, kernel, C::kThreads, C::kSmem));
    // INDEXER_GPU_WS_BLOCKS_PER_SM caps the grid (experiments; unset in
    // production).
    if (Knobs().ws_blocks_per_sm > 0) n = std::min(n, Knobs().ws_blocks_per_sm);
    return std::max(n, 1);
  });
  if (!per_sm.ok()) return per_sm.status();
  // Persistent: as many blocks as fit at once, each an equal share. (A floor
  // of 2 or 4 units per block, to amortize a block's set-up at small batch,
  // measured no better: B=1 n=128k 17.2-18.9 us at 1, 17.2-17.3 at 2, 21.5 at 4.)
  const int64_t units = p.unit_end - p.unit_begin;
  const int64_t grid = std::min<int64_t>(units, static_cast<int64_t>(*per_sm) * p.num_sms);
  // The claimed tail (dense walk): p.tail's share of the units, where the
  // rule applies to the launch's groups and every block keeps at least its
  // minimum of its own (plan.h: WsTailUnits).
  p.tail_units = !kGather && p.claims != nullptr ? WsTailUnits(p.tail, units, grid, p.max_group_rows) : 0;
  GPU_LAUNCH(kernel, static_cast<int>(grid), C::kThreads, C::kSmem, stream, p, rows8);
  return absl::OkStatus();
}

// Configurations: <heads, rows per warpgroup, warpgroups per team, math
// warpgroups, slots, blocks per SM>, picked by H and the group's rows.
template <int kHeads, int kRows>
struct WsPick;
// With the top-k's first histogram (LogitsParams::topk_hist): the H 64
// decode configurations below plus 2 x 8 KiB of histograms, in fewer ring
// slots so that three blocks still fit an SM's shared memory: two per team
// for one row (68 KiB), five for the one team of two rows (75 KiB). The
// weights in registers (kWReg) and the one-round-trip stage, H200, same
// call, median of 3: B=64 x 32k next_n 2 logits 119.4 us against 127.2,
// B=64 x 8k 33.4 against 35.0, B=128 x 32k 158.1 against 160.0, prefill
// 4k x 32k 2328 against 2396 (h200_2026-12-03_s15.md). Tried there too,
// not kept: two blocks per SM with 8 slots, one block of 4 warpgroups with
// 12 or 16 slots (B=64 x 32k 91-92 / 101-104 against 89-91), and two
// accumulators with the next tile's wgmma issued before the epilogue
// (ptxas serializes the wgmma: accumulators read on a divergent path).
// Nor 16-bit bins (two a word, a mid-row flush every 1023 tiles) for six
// slots at both row counts (f513be4, reverted): H100, same call, against
// these, next_n 2 logits +5.2 to +5.5 us at B=64 / 128 x 32k and B=128 x
// 128k, B=1 x 32k / 128k +1.4 / +2.2, next_n 1 at B=64 / 128 +0.2 / +1.4
// (h100_2026-12-07_s37.md).
template <int kRows>
struct WsHistPick;
template <>
struct WsHistPick<1> { using C = WsConfig<64, 1, 1, 2, 4, 3, true, true>; };
template <>
struct WsHistPick<2> { using C = WsConfig<64, 1, 2, 2, 5, 3, true, true>; };
// H = 64. One row: N = 64, two warpgroups on separate tiles, three blocks
// per SM (72 registers, 67 KiB).
template <>
struct WsPick<64, 1> { using C = WsConfig<64, 1, 1, 2, 6, 3>; };
// Two rows (next_n 2): both warpgroups on every tile, one row each, so the
// registers and blocks per SM stay those of one row. (Measured against one
// N = 128 warpgroup per tile at two blocks per SM, B=64 n=32k: 139 vs 142 us
// and 134 vs 160 us; against two such teams in one block per SM: 139 vs 208.)
template <>
struct WsPick<64, 2> { using C = WsConfig<64, 1, 2, 2, 6, 3>; };
// Three or four rows (next_n 3-4, prefill groups): a team of two
// warpgroups of N = 128, two blocks per SM (96 registers). (Prefill 4k x 32k:
// 700 TFLOP/s; two such teams in one block per SM 580, a team of four N = 64
// warpgroups in one block 587, the serial N = 256 kernel 519.)
template <>
struct WsPick<64, 4> { using C = WsConfig<64, 2, 2, 2, 8, 2>; };
// H = 32 and 16: a warpgroup takes as many of the group's rows as keep
// N <= 64, so every configuration has H = 64's one-row footprint (N = 64,
// three blocks per SM) or less: separate tiles while N allows, a team of
// two (one tile, two row halves) past it.
template <>
struct WsPick<32, 1> { using C = WsConfig<32, 1, 1, 2, 6, 3, false, true>; };  // N = 32
template <>
struct WsPick<32, 2> { using C = WsConfig<32, 2, 1, 2, 6, 3>; };  // N = 64
template <>
struct WsPick<32, 4> { using C = WsConfig<32, 2, 2, 2, 6, 3>; };  // N = 64, teams of 2
template <>
struct WsPick<16, 1> { using C = WsConfig<16, 1, 1, 2, 6, 3, false, true>; };  // N = 16
template <>
struct WsPick<16, 2> { using C = WsConfig<16, 2, 1, 2, 6, 3>; };  // N = 32
template <>
struct WsPick<16, 4> { using C = WsConfig<16, 4, 1, 2, 6, 3>; };  // N = 64
// The gather walk (groups of one row): the one-row configurations. (Eight
// slots would not leave three blocks per SM at H 32: 3 x 77 KiB plus the
// per-block reserve is over 228 KiB.)
template <int kHeads>
struct WsGatherPick {
  using C = typename WsPick<kHeads, 1>::C;
};

}  // namespace

bool WgmmaWsSupported(const LogitsParams& p) {
  return p.use_tma && p.max_group_rows <= kMaxGroupRows && MmaHeadsSupported(p.num_heads) &&
         WgmmaTmaSupported(p.layout);
}

bool WgmmaWsEnabled() {
  // INDEXER_GPU_WGMMA_WS=0 selects the serial wgmma kernel (A/B runs; knobs.h).
  return Knobs().wgmma_ws;
}

bool WgmmaWsFillsTopkHist(const LogitsParams& p) {
  // WsHistPick's configurations: H 64, groups of one or two rows.
  return p.topk_hist != nullptr && TopkFuseEnabled() && WgmmaWsSupported(p) && p.num_heads == 64 &&
         p.max_group_rows <= 2;
}

absl::Status LaunchDenseLogitsWgmmaWs(const LogitsParams& p, Stream stream) {
  if (p.unit_end == p.unit_begin) return absl::OkStatus();
  if (!WgmmaWsSupported(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warp-specialized wgmma logits: expected a tensor-mapped pool and groups of <= ",
        kMaxGroupRows, " rows, got ", p.max_group_rows, " rows, use_tma ", p.use_tma));
  }
  if (WgmmaWsFillsTopkHist(p)) {
    if (p.max_group_rows <= 1) return LaunchWs<WsHistPick<1>::C>(p, stream, p.tmap);
    return LaunchWs<WsHistPick<2>::C>(p, stream, p.tmap);
  }
  return DispatchWgmmaRows(p.max_group_rows <= 1 ? 1 : p.max_group_rows <= 2 ? 2 : 4,
                           [&](auto r) -> absl::Status {
    return DispatchMmaHeads(p.num_heads, [&](auto h) -> absl::Status {
      return LaunchWs<typename WsPick<decltype(h)::value, decltype(r)::value>::C>(p, stream, p.tmap);
    });
  });
}

bool WgmmaWsGatherSupported(const LogitsParams& p) {
  return p.use_tma && p.max_group_rows == 1 && MmaHeadsSupported(p.num_heads) && WgmmaTmaSupported(p.layout) &&
         p.gather_blocks != nullptr && p.gather_entries != nullptr && p.gather_block >= kBoxEntries &&
         p.gather_block % kBoxEntries == 0;
}

absl::Status LaunchDenseLogitsWgmmaWsGather(const LogitsParams& p, const TensorMap& rows8, Stream stream) {
  if (p.unit_end == p.unit_begin) return absl::OkStatus();
  if (!WgmmaWsGatherSupported(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "warp-specialized gather walk: expected a tensor-mapped pool, groups of 1 row, pool entries and "
        "pool blocks of a multiple of ", kBoxEntries, " entries, got ", p.max_group_rows, " rows, use_tma ",
        p.use_tma, ", block ", p.gather_block));
  }
  return DispatchMmaHeads(p.num_heads, [&](auto h) -> absl::Status {
    return LaunchWs<typename WsGatherPick<decltype(h)::value>::C, true>(p, stream, rows8);
  });
}

}  // namespace gpu
}  // namespace indexer
