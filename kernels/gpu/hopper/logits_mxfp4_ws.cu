// Hopper (sm_90a) MXFP4 dense logits, warp-specialized: the decode fast path
// for linear MXFP4 pages of a multiple of 64 entries, H = 16, 32 or 64 (a
// template constant), D = 128.
//
// Structure as logits_wgmma_ws.cu: a persistent grid, block b streams an
// equal contiguous share of the plan's units as 64-entry K tiles through a
// ring of kSlots slots, consumed round robin by kMath math warpgroups. The
// producer warp looks its tiles up a window of 32 at a time (TileWalk,
// tile_window.h) and lane 0 issues each tile: one bulk copy of the slot's
// 4352 bytes when pages hold 64 entries (the tile is its page: 4 KiB of
// packed values, then 256 scale bytes), else two (values and scales, two
// contiguous runs of one page), plus the tile's unit facts in shared
// memory, so neither side waits on a block-table or unit load between two
// tiles.
//
// K is the wgmma A operand from REGISTERS: every math thread reads its
// fragment bytes (16 packed bytes per entry row) and the entry's scale word
// from the slot, releases the slot at once, and widens e2m1 to e5m2 with a
// byte-permute table. Q (B operand, N = kRows * H heads) is widened once per
// row group into a 128-byte-swizzled tile.
//
// Exactness (SPEC §3: sum_b 2^(eq_b + ek_b - 254) * P_b, P_b the exact 32-term
// partial of block b). The reduction dimension is permuted identically in A
// and B so that thread quad lane t holds all of block t of its rows: k-slice
// j takes elements 8j..8j+7 of every block (A bytes t*4.. and 16 + t*4..).
//   fast route: each block's values are scaled in the operand by 2^-s, s =
//     (the entry's / head's largest block exponent) - (the block's), exact
//     in e5m2 for s <= 13; one accumulator chain then yields
//     sum_b 2^-(s_b + sq_b) P_b, and the powers 2^(ek_max - 127) (per entry,
//     after the head sum) and 2^(eq_max - 127) (per head, in the weight)
//     restore the scale. Every block partial is exact; the four are summed
//     in the tensor core's fp32 accumulator, as the FP8 kernel sums its
//     products.
//   per-block route, for a tile with an entry outside that range (a block
//     shift > 13 on a nonzero block, or a largest exponent farther than
//     kExpWindow from 2^0): four chains, chain b with every block but b
//     zeroed in A, each P_b exact in its own accumulator, then
//     total += C_b * 2^(ek_b - 127) in fp32. A row group whose Q is outside
//     the range is staged unscaled and all its tiles take this route with the
//     factor 2^(ek_b - 127) * 2^(eq_b - 127) per (entry, head, block).
//   The route is uniform over a warpgroup (bar.red.or), since wgmma is.
//
// The candidate consumer's gather walk (kGather, LogitsParams::gather_*)
// runs the same math warpgroups over the pool's compact slots: tile n is
// slots [64 t, 64 t + 64) of one row, each 8-slot chunk 8 consecutive
// entries of one pool block (blocks of a multiple of 8 entries), so a chunk
// is two contiguous runs of one page: 512 value bytes and 32 scale bytes,
// copied into the tile's places in the slot by 16-byte cp.async of four
// producer lanes (a tile: 10 warp instructions; 16 per-lane bulk copies,
// issued lane by lane, held the walk at ~1.2 us per tile), completing on
// the slot's `full` barrier by cp.async.mbarrier.arrive. Four producer
// warps walk (GatherProducerMx), warp w the tiles of slots w, w + 4, ...:
// in rounds of kSlots tiles, lane i < kSlots / 4 holds the unit facts of
// the warp's tile i of the round and lane L its chunk L; a round's pool
// blocks (and the rows' pool entries) are loaded two rounds ahead of its
// copies and its pages one round ahead, so neither dependent load sits
// between two copies. Chunks at or past the
// row's pool entries copy nothing: their slot rows are stale, never stored
// (the epilogue stores slots below gather_entries[row]) and left out of
// the route choice (the tile's end is clamped to the pool entries).
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/dispatch.h"
#include "kernels/gpu/gather_logits.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/knobs.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/per_device.h"
#include "kernels/gpu/hopper/tile_window.h"
#include "kernels/gpu/hopper/trace_sm90.h"
#include "kernels/gpu/hopper/wgmma_sm90.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kMxTile = 64;                          // entries per K tile (wgmma M)
static_assert(kMxTile == kWindowTile, "the producer walks tiles of TileWalk's size");
constexpr int kMxDim = 128;                          // D
constexpr int kMxValueBytes = kMxTile * kMxDim / 2;  // packed e2m1 of a tile
constexpr int kMxScaleBytes = kMxTile * kMxDim / 32; // e8m0 of a tile
constexpr int kMxSlotBytes = kMxValueBytes + kMxScaleBytes;
constexpr int kMxWgSize = 4 * kWarpSize;             // a warpgroup
// e2m1 * 2^-s stays a normal e5m2 value for s <= 13 (0.5 * 2^-13 = 2^-14).
constexpr uint32_t kMaxShift = 13;
// Fast route only for largest block exponents within 2^+-60: the folded
// powers and the weight products stay normal fp32.
constexpr uint32_t kExpWindow = 60;

template <int kHeads, int kRows, int kMath, int kStages, int kProducers>
struct MxConfig {
  static constexpr int kN = kRows * kHeads;                // wgmma N
  static constexpr int kSlots = kMath * kStages;           // ring slots
  static constexpr int kThreads = (kMath * kMxWgSize / kWarpSize + kProducers) * kWarpSize;  // + producer warps
  static constexpr int kQBytes = kN * kMxDim;              // one warpgroup's widened Q
  // Shared memory from a 1024-byte aligned base: Q per warpgroup (swizzled,
  // 1024-byte aligned) | slots [values | scales] | per warpgroup: weights
  // [kN], Q block factors [kN, 4], Q block shifts [kN] | alignment slack.
  static constexpr int kOffSlots = kMath * kQBytes;
  static constexpr int kOffW = kOffSlots + kSlots * kMxSlotBytes;
  static constexpr int kOffSq = kOffW + kMath * kN * 4;
  static constexpr int kOffSh = kOffSq + kMath * kN * 16;
  static constexpr int kSmem = kOffSh + kMath * kN * 4 + 1024;
  // One block per SM: each of the four SM sub-partitions holds 16K
  // registers and ceil(warps / 4) of the block's warps.
  static constexpr int kMaxRegs = 16384 / ((kThreads / kWarpSize + 3) / 4 * kWarpSize) / 8 * 8;

  static_assert(kN == 16 || kN == 32 || kN == 64 || kN == 128, "wgmma N of 16 to 128");
  static_assert(kN <= kMxWgSize, "Q staging: one thread per head");
  static_assert(kMath >= 1 && kMath <= 4, "1..4 math warpgroups (named barriers 1..kMath)");
  static_assert(kStages >= 2, "at least double-buffered per warpgroup");
  static_assert(kProducers >= 1 && kSlots % kProducers == 0, "every producer warp owns the same slots");
  static_assert(kOffSlots % 1024 == 0 && kQBytes % 1024 == 0, "swizzled Q 1024-byte aligned");
  static_assert(kMxSlotBytes % 16 == 0 && kMxValueBytes % 16 == 0, "bulk copies land 16-byte aligned");
  static_assert(kSmem <= 227 * 1024, "fits one block's shared memory");
};

#if INDEXER_GPU_WGMMA
// e5m2 codes of the e2m1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} * 2^-s
// (s <= kMaxShift: each exponent field stays >= 1), as the two words of a
// byte-permute table.
__device__ __forceinline__ uint2 E5m2Table(uint32_t s) {
  return make_uint2(0x3e3c3800u - s * 0x04040400u, 0x46444240u - s * 0x04040404u);
}

// Four e2m1 nibbles (bits 0..15 of x, element i in nibble i) -> four e5m2
// codes (element i in byte i): magnitude through the table, sign to bit 7.
__device__ __forceinline__ uint32_t WidenE2m1x4(uint32_t x, uint2 lut) {
  return __byte_perm(lut.x, lut.y, x & 0x7777u) | __byte_perm(0u, 0x80808080u, (x >> 1) & 0x4444u);
}

// prmt.b32 in its default mode: a selector nibble with bit 3 set replicates
// the selected byte's bit 7 over the byte (CUDA's __byte_perm ignores bit 3).
__device__ __forceinline__ uint32_t Prmt(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Eight e2m1 nibbles (element i in nibble i of w) -> eight e5m2 codes,
// elements 0..3 in lo and 4..7 in hi (element i in byte i % 4), in 9
// operations (two WidenE2m1x4 take 13): the magnitudes through the table;
// the signs by prmt's sign replication, element 2j's sign (bit 8j + 3) being
// bit 7 of byte j of w << 4 and element 2j + 1's (bit 8j + 7) bit 7 of byte
// j of w; one LOP3 per word merges them (the table's bytes are below 0x80).
__device__ __forceinline__ void WidenE2m1x8(uint32_t w, uint2 lut, uint32_t& lo, uint32_t& hi) {
  const uint32_t m = w & 0x77777777u;  // selector nibbles of the magnitudes
  const uint32_t w4 = w << 4;
  const uint32_t mlo = Prmt(lut.x, lut.y, m);        // prmt reads c's low 16 bits
  const uint32_t mhi = Prmt(lut.x, lut.y, m >> 16);
  lo = (Prmt(w4, w, 0xd9c8u) & 0x80808080u) | mlo;  // elements 0..3: bytes 0, 4, 1, 5 signed
  hi = (Prmt(w4, w, 0xfbeau) & 0x80808080u) | mhi;  // elements 4..7: bytes 2, 6, 3, 7 signed
}

// max.u16x2: one instruction on sm_90 (__vmaxu4, which the route used
// before, is emulated there: ~25 dependent operations a word).
__device__ __forceinline__ uint32_t MaxU16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// The largest byte of each of two words (a's in .x, b's in .y), in 13
// instructions (SASS): byte pairs as 16-bit lanes, then the two words'
// halves. The two emulated __vmaxu4 per word took ~60.
__device__ __forceinline__ uint2 MaxBytes2(uint32_t a, uint32_t b) {
  const uint32_t ma = MaxU16x2(a & 0x00ff00ffu, (a >> 8) & 0x00ff00ffu);  // {max(a0, a1), max(a2, a3)}
  const uint32_t mb = MaxU16x2(b & 0x00ff00ffu, (b >> 8) & 0x00ff00ffu);
  const uint32_t m = MaxU16x2(__byte_perm(ma, mb, 0x5410), __byte_perm(ma, mb, 0x7632));
  return make_uint2(m & 0xffffu, m >> 16);
}

__device__ __forceinline__ bool InWindow(uint32_t e) {
  return e + kExpWindow >= 127u && e <= 127u + kExpWindow;
}

__device__ __forceinline__ uint32_t Word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Whether the fast route holds for one entry row: block t's shift from the
// row's largest exponent, exact when <= kMaxShift or the block is all zeros.
__device__ __forceinline__ bool FastRow(const uint4& v, uint32_t sc, uint32_t emax, int t) {
  const uint32_t s = emax - ((sc >> (8 * t)) & 0xffu);
  const bool zero = ((v.x | v.y | v.z | v.w) & 0x77777777u) == 0;
  return (s <= kMaxShift || zero) && InWindow(emax);
}
#endif  // INDEXER_GPU_WGMMA

// ---- the gather walk's producer (the whole warp) ---------------------------
constexpr int kMxBoxEntries = 8;                                  // entries per chunk
constexpr int kMxBoxValueBytes = kMxBoxEntries * kMxDim / 2;      // 512 B of values
constexpr int kMxBoxScaleBytes = kMxBoxEntries * kMxDim / 32;     // 32 B of scales
constexpr int kMxTileBoxes = kMxTile / kMxBoxEntries;             // 8 chunks per tile

// Tiles of one unit.
__device__ __forceinline__ int32_t UnitTiles(const LogitsUnit& u) {
  return (u.e_end - u.e_begin + kMxTile - 1) / kMxTile;
}
// Tiles of the block's units [u_first, u_last): every lane of the warp
// calls it and gets the sum (a unit a lane, then a shuffle reduction; a
// loop of one thread over the units, dependent loads, held each consumer
// ~5 us at the start of the V4.1 gather walk: H200 ncu source view).
__device__ __forceinline__ int32_t ShareTiles(const LogitsParams& p, int32_t u_first, int32_t u_last) {
  int32_t tiles = 0;
  for (int32_t i = u_first + LaneId(); i < u_last; i += kWarpSize) tiles += UnitTiles(p.step.units[i]);
#pragma unroll
  for (int d = kWarpSize / 2; d >= 1; d >>= 1) tiles += ShflXor(tiles, d);
  return tiles;
}

// Producer warp pw of kProducers copies its tiles of [0, total) of the
// block's units [u_first, u_last) into the ring (tile n -> slot n % kSlots;
// the warp's tiles are those of its slots pw, pw + kProducers, ...), with
// each slot's {group, first slot, end} in tinfo (the end clamped to the
// row's pool entries); a slot's `empty` completion is waited on before its
// reuse.
template <int kSlots, int kProducers>
__device__ __forceinline__ void GatherProducerMx(const LogitsParams& p, int pw, int32_t u_first, int32_t u_last,
                                                 int32_t total, uint8_t* slots, int4* tinfo, uint64_t* full,
                                                 uint64_t* empty) {
#if INDEXER_GPU_WGMMA
  constexpr int kMine = kSlots / kProducers;                     // the warp's tiles of a round
  constexpr int kChunks = kMine * kMxTileBoxes;                  // their chunks
  constexpr int kIters = (kChunks + kWarpSize - 1) / kWarpSize;  // chunks per lane
  static_assert(kMine <= kWarpSize, "one walker lane per tile of the warp's round");
  const PageLayout& l = p.layout;
  const int lane = LaneId();
  // Walker lane i < kMine: its cursor on tile pw + i * kProducers of each
  // round (round r: tiles [r * kSlots, (r + 1) * kSlots)).
  const int my = pw + lane * kProducers;
  const bool walker = lane < kMine;
  int32_t cu = u_first, ct = 0;
  LogitsUnit u = p.step.units[cu];
  LogitsUnit nxt = p.step.units[min(cu + 1, u_last - 1)];  // in flight a unit ahead
  // The cursor k tiles on (REQUIRES: that tile is in the share).
  auto advance = [&](int32_t k) {
    ct += k;
    for (int32_t t = UnitTiles(u); ct >= t; t = UnitTiles(u)) {
      ct -= t;
      ++cu;
      u = nxt;
      nxt = p.step.units[min(cu + 1, u_last - 1)];
    }
  };
  if (walker && my < total) advance(my);
  // A round in two steps: walked (the lane's chunks' pool blocks and the
  // rows' pool entries in flight), then located (their pages in flight).
  // Per-tile facts stay in their walker lane (shuffled where needed), the
  // chunks' flags in bit masks.
  struct Walked {
    int32_t group, first, end, seq, cnt;  // walker lane: its tile's (cnt: the row's pool entries)
    uint32_t in;                          // bit k: chunk k starts inside its unit
    int32_t s[kIters], blk[kIters];
  };
  struct Located {
    int4 ti;         // walker lane: {group, first, min(end, pool entries)}
    uint32_t valid;  // bit k: chunk k holds pool entries: copy it
    int32_t page[kIters], e[kIters];
  };
  int32_t n_walk = 0;  // the next round to walk (its first tile)
  auto walk = [&](Walked& w) {
    const int32_t n0 = n_walk;
    n_walk += kSlots;
    const bool mine = walker && n0 + my < total;
    int32_t row = 0;
    w.group = 0, w.first = 0, w.end = 0, w.seq = 0, w.cnt = 0;
    if (mine) {
      w.group = u.group;
      w.first = u.e_begin + ct * kMxTile;
      w.end = u.e_end;
      w.seq = u.seq;
      row = u.row_begin;
      w.cnt = p.gather_entries[row];
      if (n0 + kSlots + my < total) advance(kSlots);
    }
    w.in = 0;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int c = lane + k * kWarpSize;  // chunk c: tile c / 8 of the warp's, box c % 8
      const int j = min(c / kMxTileBoxes, kMine - 1);
      const int32_t first = ShflIdx(w.first, j), end = ShflIdx(w.end, j);
      const int32_t r = ShflIdx(row, j);
      w.s[k] = first + (c % kMxTileBoxes) * kMxBoxEntries;
      // slot < end <= the row's pool size: the block index is in the row.
      const bool in = c < kChunks && n0 + pw + j * kProducers < total && w.s[k] < end;
      w.blk[k] = 0;
      if (in) {
        w.in |= 1u << k;
        w.blk[k] = p.gather_blocks[static_cast<int64_t>(r) * p.gather_stride + w.s[k] / p.gather_block];
      }
    }
  };
  auto locate = [&](const Walked& w, Located& o) {
    o.ti = make_int4(w.group, w.first, min(w.end, w.cnt), 0);
    o.valid = 0;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int c = lane + k * kWarpSize;
      const int j = min(c / kMxTileBoxes, kMine - 1);
      const int32_t cnt = ShflIdx(w.cnt, j), seq = ShflIdx(w.seq, j);
      o.page[k] = 0;
      o.e[k] = 0;
      if (((w.in >> k) & 1u) != 0 && w.s[k] < cnt) {
        o.valid |= 1u << k;
        // 8 entries from a multiple of 8 in one block: one page (E % 64 == 0).
        const PagePos at = PagePosOf(l, w.blk[k] * p.gather_block + w.s[k] % p.gather_block);
        o.page[k] = p.step.block_table[static_cast<int64_t>(seq) * p.step.max_pages + at.lp];
        o.e[k] = at.e;
      }
    }
  };
  int32_t n0 = 0;  // the round being issued (its first tile)
  auto issue = [&](const Located& o) {
#pragma unroll
    for (int j = 0; j < kMine; ++j) {
      const int slot = pw + j * kProducers;
      if (n0 + slot < total) {
        constexpr int kPerIter = kWarpSize / kMxTileBoxes;  // tiles of one chunk iteration
        const int k = j / kPerIter;
        // Tile n0 + slot - kSlots was the slot's last use: its release is
        // completion n0 / kSlots - 1 of `empty` (every lane waits: its
        // copies follow).
        if (n0 >= kSlots) MbarWait(&empty[slot], static_cast<uint32_t>(n0 / kSlots + 1) & 1u);
        // Lane L copies quarter L % 4 of chunk L / 4 of the tile (128 value
        // bytes, and 16 of its 32 scale bytes for quarters 0 and 1): the
        // chunk's page and entry come from the lane that located it.
        const int src = (j % kPerIter) * kMxTileBoxes + lane / 4;
        const bool go = ((ShflIdx(o.valid, src) >> k) & 1u) != 0;
        const int32_t pg = ShflIdx(o.page[k], src), e = ShflIdx(o.e[k], src);
        const int4 ti = make_int4(ShflIdx(o.ti.x, j), ShflIdx(o.ti.y, j), ShflIdx(o.ti.z, j), 0);
        if (go) {
          const int box = lane / 4, q = lane % 4;
          const uint8_t* base = p.pool + l.PageOffset(pg);
          const uint8_t* sv = base + l.ValueOffset(e, 0) + q * 128;
          uint8_t* dst = slots + slot * kMxSlotBytes;
          uint8_t* dv = dst + box * kMxBoxValueBytes + q * 128;
#pragma unroll
          for (int i = 0; i < 8; ++i) CpAsync16(dv + 16 * i, sv + 16 * i, true);
          if (q < 2) {
            CpAsync16(dst + kMxValueBytes + box * kMxBoxScaleBytes + q * 16, base + l.ScaleOffset(e, 0) + q * 16,
                      true);
          }
        }
        // Every lane's arrival fires when its copies of the slot have landed
        // (none: at once); lane 0's plain arrival releases the slot's info.
        CpAsyncArriveNoinc(&full[slot]);
        if (lane == 0) {
          tinfo[slot] = ti;
          MbarArrive(&full[slot]);
        }
      }
    }
    n0 += kSlots;
  };
  // Round i's copies go out while round i + 1's pages and round i + 2's
  // pool blocks are in flight.
  Walked a;
  Located b, c;
  walk(a);
  locate(a, b);
  walk(a);
  while (n0 < total) {
    locate(a, c);
    walk(a);
    issue(b);
    b = c;
  }
#else
  (void)p, (void)pw, (void)u_first, (void)u_last, (void)total, (void)slots, (void)tinfo, (void)full, (void)empty;
#endif  // INDEXER_GPU_WGMMA
}

// Producer warps: one for the dense walk (its copies are whole tiles, one
// or two bulk copies each); kGatherProducers for the gather walk, whose
// tiles are eight chunks copied by cp.async. One gather producer warp
// (~110 instructions a tile, SHFL and icache latency, 12 slots unrolled)
// was the V4.1 consumer's limit: H200 ncu, B=64 x 128k pool 2048 x 8,
// 7.7 us a round of 12 tiles, the consumers 47 % of samples on `full`.
// Four warps sit on the four SM sub-partitions and cost no registers (the
// block's 13 warps already took ceil(13 / 4) = 4 per sub-partition).
constexpr int kGatherProducers = 4;

template <bool kGather>
constexpr int MxProducers() {
  return kGather ? kGatherProducers : 1;
}

template <int kHeads, int kRows, int kMath, int kStages, bool kGather>
__global__ void __launch_bounds__((MxConfig<kHeads, kRows, kMath, kStages, MxProducers<kGather>()>::kThreads))
    INDEXER_MAXNREG((MxConfig<kHeads, kRows, kMath, kStages, MxProducers<kGather>()>::kMaxRegs))
        DenseLogitsWgmmaMxfp4Kernel(const INDEXER_GRID_CONSTANT LogitsParams p) {
  // kGather: the consumer's gather walk (groups of one row).
#if INDEXER_GPU_WGMMA
  using C = MxConfig<kHeads, kRows, kMath, kStages, MxProducers<kGather>()>;
  constexpr int kN = C::kN, kSlots = C::kSlots;
  static_assert(kMxWgSize == 128, "wgmma runs on warpgroups of 128 threads");
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = AlignSmem1024(smem_raw);
  uint8_t* slots = smem + C::kOffSlots;  // [kSlots][64 x 64 B values | 64 x 4 B scales]
  __shared__ __align__(8) uint64_t full[kSlots];   // producer -> warpgroup
  __shared__ __align__(8) uint64_t empty[kSlots];  // warpgroup -> producer
  // Per slot, written by the producer before its copies: {group, the tile's
  // first entry, the unit's end}; the consumers walk no units.
  __shared__ int4 tinfo[kSlots];

  // ---- this block's share of the units ----------------------------------
  const int64_t units = p.unit_end - p.unit_begin;
  const int32_t u_first = p.unit_begin + static_cast<int32_t>(units * blockIdx.x / gridDim.x);
  const int32_t u_last = p.unit_begin + static_cast<int32_t>(units * (blockIdx.x + 1) / gridDim.x);
  if (u_first == u_last) return;
  const int tid = threadIdx.x, warp = WarpId(), lane = LaneId();
  // The bench's timeline (trace_sm90.h): thread 0 (the math side's traced
  // thread) and the dense walk's copy warp's lane 0; null otherwise and
  // untraced.
  auto trace = [&](bool mine) { return mine ? TraceRecord(p.trace, p.trace_blocks) : nullptr; };
  if (tid == 0) {
    TraceEntry(trace(true));
    for (int s = 0; s < kSlots; ++s) {
      // The producer's expect_tx; the gather walk's: one cp.async arrival
      // per producer lane and lane 0's plain one.
      MbarInit(&full[s], kGather ? kWarpSize + 1 : 1);
      MbarInit(&empty[s], kMxWgSize);               // every thread of the consuming warpgroup
    }
    FenceMbarInit();
  }
  __syncthreads();  // the last block-wide barrier: the roles part here

  // ---- producer warps -----------------------------------------------------
  // The gather walk: GatherProducerMx in each of its kGatherProducers warps.
  // The dense walk, one warp, in windows, lane 0 issuing every tile:
  // the whole warp looks up a window of kWarpSize tiles at once (TileWalk,
  // tile_window.h), the next window's lookups in flight while lane 0
  // issues this one's copies from registers. One thread issues every copy
  // (the warp waits with it): with one issuing lane per slot,
  // compute-sanitizer racecheck reported the consumers' slot reads racing
  // the slot's next bulk copy once slots were reused many times, and a
  // single issuer is clean.
  if (warp >= kMath * (kMxWgSize / kWarpSize)) {
    if constexpr (kGather) {
      const int32_t total = ShareTiles(p, u_first, u_last);
      GatherProducerMx<kSlots, kGatherProducers>(p, warp - kMath * (kMxWgSize / kWarpSize), u_first, u_last,
                                                 total, slots, tinfo, full, empty);
      return;
    }
    const PageLayout& l = p.layout;
    // With 64-entry pages a tile is its whole page, values then scales:
    // one bulk copy of the slot's bytes (else two runs of one page).
    const bool whole_page = l.page_entries == kMxTile;
    TileWalk walk(p, u_first, u_last);
    int32_t n = 0;  // the next tile to issue
    // Tile n from its page's value and scale runs (lane 0).
    auto copy = [&](uint64_t v, uint64_t sc, const int4& ti) {
      const int slot = n % kSlots;
      tinfo[slot] = ti;  // released by the arrive
      MbarArriveExpectTx(&full[slot], kMxSlotBytes);
      uint8_t* dst = slots + slot * kMxSlotBytes;
      if (whole_page) {
        BulkLoad(dst, reinterpret_cast<const void*>(v), kMxSlotBytes, &full[slot]);
      } else {
        BulkLoad(dst, reinterpret_cast<const void*>(v), kMxValueBytes, &full[slot]);
        BulkLoad(dst + kMxValueBytes, reinterpret_cast<const void*>(sc), kMxScaleBytes, &full[slot]);
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
        const uint8_t* page = p.pool + l.PageOffset(w.lead);
        copy(reinterpret_cast<uint64_t>(page + l.ValueOffset(w.e, 0)),
             reinterpret_cast<uint64_t>(page + l.ScaleOffset(w.e, 0)), make_int4(w.group, w.first, w.end, 0));
      }
      ++n;
      return 1;
    };
    auto rest = [&](const TileWindow& w, int i) {
      if (i >= w.count) return;
      const uint8_t* page = p.pool + l.PageOffset(w.page);
      const uint64_t vsrc = reinterpret_cast<uint64_t>(page + l.ValueOffset(w.e, 0));
      const uint64_t ssrc = reinterpret_cast<uint64_t>(page + l.ScaleOffset(w.e, 0));
      for (; i < w.count; ++i, ++n) {
        const uint64_t v = ShflIdx(vsrc, i);
        const uint64_t sc = whole_page ? 0 : ShflIdx(ssrc, i);
        const int4 ti = make_int4(ShflIdx(w.group, i), ShflIdx(w.first, i), ShflIdx(w.end, i), 0);
        wait_slot();
        if (lane == 0) copy(v, sc, ti);
      }
    };
    WalkWindows(walk, lead, rest);
    TraceCopyEnd(trace(lane == 0));
    return;
  }
  const int32_t total = ShareTiles(p, u_first, u_last);

  // ---- math warpgroup wg: tiles wg, wg + kMath, ... -------------------------
  // wg by a shuffle from lane 0: warp-uniform to the compiler (descriptor
  // arithmetic in uniform registers; logits_wgmma_ws.cu).
  const int wg = ShflIdx(warp / (kMxWgSize / kWarpSize), 0);
  const int wt = tid % kMxWgSize, wwarp = warp % (kMxWgSize / kWarpSize);
  const int gq = lane / 4, t = lane % 4;
  uint8_t* q_s = smem + wg * C::kQBytes;                                   // [kN, 128] e5m2, swizzled
  float* w_s = reinterpret_cast<float*>(smem + C::kOffW) + wg * kN;       // [kN], halved
  float* sq_s = reinterpret_cast<float*>(smem + C::kOffSq) + wg * kN * 4; // [kN, 4]
  uint32_t* sh_s = reinterpret_cast<uint32_t*>(smem + C::kOffSh) + wg * kN;  // [kN] 4 shift bytes
  const uint64_t desc_q = Sw128KMajorDesc(q_s);
  int32_t staged = -1;             // group whose Q this warpgroup holds
  int32_t g_rows = 0, g_row0 = 0;  // its rows; its first row in the sub-chunk
  int32_t n_r[kRows];
  // The fast route's share of a tile's logits per lane (QuadTransposedSums):
  // row lane_row of the group, entry e0 + 8 (t & 1); at one row lanes t < 2
  // write. lane_out and lane_n (0: nothing to write) are set at each stage.
  // H100, same call, against every sum in every lane (s29, three rounds):
  // B=64 x 32k logits 104.6 -> 101.5 us, next_n 2 141.5 -> 126.1.
  const int lane_row = kRows == 2 ? t >> 1 : 0;
  const bool lane_writes = kRows > 1 || t < 2;
  float* lane_out = p.logits;
  int32_t lane_n = 0;
  bool q_raw = false;              // its Q is staged unscaled (per-block route)

  // ---- one tile's slot: K rows e0, e0 + 8 (block t's bytes, the scale
  // words), the slot released, and the K side of the route -----------------
  // (A barrier-free first check from the tile's 64 scale words alone,
  // every warp reading all of them, measured slower: H200, dense B=128 x
  // 128k 743 -> 835 us, B=64 x 32k 115 -> 126; the consumers are
  // issue-bound and the check cost more than the vote it skipped.)
  // Tile n + kMath's fetch runs while tile n's wgmmas are in flight (its
  // slot wait, loads and vote, a barrier of the warpgroup, under the tensor
  // core's latency); the vote is on K alone, the group's Q side (q_raw)
  // joins it once the tile's group is staged.
  const int e0 = wwarp * 16 + gq;
  struct Fetched {
    int4 ti;  // {group, first entry, unit end}: read before the release
    uint4 v0, v1;
    uint32_t sc0, sc1;
    uint2 emax;
    bool k_bad;  // some entry of the tile needs the per-block route
  };
  auto fetch = [&](int32_t n, Fetched& f) {
    const int slot = n % kSlots;
    TraceMathWait(p.trace != nullptr, trace(tid == 0), [&] { MbarWait(&full[slot], static_cast<uint32_t>(n / kSlots) & 1u); });
    f.ti = tinfo[slot];
    const uint8_t* kv = slots + slot * kMxSlotBytes;
    f.v0 = *reinterpret_cast<const uint4*>(kv + e0 * (kMxDim / 2) + t * 16);
    f.v1 = *reinterpret_cast<const uint4*>(kv + (e0 + 8) * (kMxDim / 2) + t * 16);
    f.sc0 = *reinterpret_cast<const uint32_t*>(kv + kMxValueBytes + e0 * 4);
    f.sc1 = *reinterpret_cast<const uint32_t*>(kv + kMxValueBytes + (e0 + 8) * 4);
    // Every thread releases its own reads: one arrival per warp after
    // __syncwarp let racecheck see the other lanes' reads race the slot's
    // next bulk copy once slots were reused many times.
    MbarArrive(&empty[slot]);
    // The route (entries past the unit are never stored: ignored).
    const int32_t pos0 = f.ti.y + e0, e_end = f.ti.z;
    f.emax = MaxBytes2(f.sc0, f.sc1);
    const bool ok = (pos0 >= e_end || FastRow(f.v0, f.sc0, f.emax.x, t)) &&
                    (pos0 + 8 >= e_end || FastRow(f.v1, f.sc1, f.emax.y, t));
    f.k_bad = NamedBarrierOr(1 + wg, kMxWgSize, !ok);
  };
  Fetched cur;
  if (wg < total) fetch(wg, cur);
  for (int32_t n = wg; n < total; n += kMath) {
    const int4 ti = cur.ti;
    const bool more = n + kMath < total;
    // ---- the group's Q (rows past the group are zero) and weights ---------
    if (ti.x != staged) {
      NamedBarrierSync(1 + wg, kMxWgSize);  // every warp is done with the old Q
      staged = ti.x;
      const LogitsGroup g = p.step.groups[ti.x];
      g_rows = g.num_rows;
      g_row0 = g.row_begin - p.row_base;
      const int64_t q0 = static_cast<int64_t>(g.row_begin - p.row_base) * kHeads;
      const int nh = g.num_rows * kHeads;
      // Phase 1, thread h = head h: largest exponent over the nonzero
      // blocks, each block's shift from it, and whether all are in range.
      bool bad = false;
      uint32_t emax = 127;
      float wh = 0.f;
      if (wt < kN) {
        uint32_t shifts = 0;
        float sq[4] = {0.f, 0.f, 0.f, 0.f};
        if (wt < nh) {
          const uint4* src = reinterpret_cast<const uint4*>(p.q_values + (q0 + wt) * (kMxDim / 2));
          const uint32_t sc = *reinterpret_cast<const uint32_t*>(p.q_scales + (q0 + wt) * 4);
          uint32_t nz = 0, m = 0;
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint4 x = src[b];
            const uint32_t eb = (sc >> (8 * b)) & 0xffu;
            if (((x.x | x.y | x.z | x.w) & 0x77777777u) != 0) {
              nz |= 1u << b;
              m = max(m, eb);
            }
            sq[b] = format_internal::ExactPow2(static_cast<int32_t>(eb) - 127);
          }
          if (nz != 0) emax = m;
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t s = (nz >> b) & 1u ? emax - ((sc >> (8 * b)) & 0xffu) : 0u;
            bad |= s > kMaxShift;
            shifts |= min(s, kMaxShift) << (8 * b);
          }
          bad |= !InWindow(emax);
          wh = p.weights[q0 + wt];
        }
        sh_s[wt] = shifts;
#pragma unroll
        for (int b = 0; b < 4; ++b) sq_s[wt * 4 + b] = sq[b];
      }
      q_raw = NamedBarrierOr(1 + wg, kMxWgSize, bad);
      if (wt < kN) {
        // Halved: ReLU(x) * w is taken as (x + |x|) * (w / 2), exact.
        wh *= 0.5f;
        if (!q_raw) {
          wh *= format_internal::ExactPow2(static_cast<int32_t>(emax) - 127);
          sq_s[wt * 4 + 0] = sq_s[wt * 4 + 1] = sq_s[wt * 4 + 2] = sq_s[wt * 4 + 3] = 1.f;
        }
        w_s[wt] = wh;
      }
      // Phase 2: 16-byte chunk c of head h holds, for block b = 0..3, the
      // e5m2 of elements 32b + 8(c/2) + 4(c%2) + 0..3 at bytes 4b..4b+3: the
      // k order of the K fragments.
#pragma unroll 1
      for (int q = wt; q < kN * (kMxDim / 16); q += kMxWgSize) {
        const int h = q / (kMxDim / 16), c = q % (kMxDim / 16);
        uint32_t o[4] = {0u, 0u, 0u, 0u};
        if (h < nh) {
          const uint32_t sh = q_raw ? 0u : sh_s[h];
          const uint8_t* src = p.q_values + (q0 + h) * (kMxDim / 2) + 4 * (c / 2) + 2 * (c % 2);
#pragma unroll
          for (int b = 0; b < 4; ++b) {
            const uint32_t x = *reinterpret_cast<const uint16_t*>(src + 16 * b);
            o[b] = WidenE2m1x4(x, E5m2Table((sh >> (8 * b)) & 0xffu));
          }
        }
        *reinterpret_cast<uint4*>(q_s + h * kMxDim + ((c ^ (h % 8)) * 16)) = make_uint4(o[0], o[1], o[2], o[3]);
      }
      // The gather walk's rows end at their pool's entries (compact slots).
      const int32_t* visible = kGather ? p.gather_entries : p.step.row_visible;
#pragma unroll
      for (int r = 0; r < kRows; ++r) n_r[r] = r < g.num_rows ? visible[g.row_begin + r] : 0;
      lane_n = 0;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (r == lane_row && lane_writes) lane_n = n_r[r];  // 0 past the group's rows
      }
      lane_out = p.logits + static_cast<int64_t>(g_row0 + (lane_row < g_rows ? lane_row : 0)) * p.stride;
      FenceProxyAsyncShared();  // Q stores before the wgmma reads
      NamedBarrierSync(1 + wg, kMxWgSize);
    }
    // Copies: the next tile's fetch overwrites cur while this tile's
    // epilogue (fast route) or chains (per-block route) still need them.
    const uint4 v0 = cur.v0, v1 = cur.v1;
    const uint32_t sc0 = cur.sc0, sc1 = cur.sc1, emax0 = cur.emax.x, emax1 = cur.emax.y;
    const int32_t pos0 = ti.y + e0;
    const bool per_block = q_raw || cur.k_bad;
    // The per-block route's stores, rows e0 (s0), e0 + 8 (s1) of query row
    // r: every lane of the quad holds both sums, two lanes store.
    auto store = [&](int r, float s0, float s1) {
      if (r < g_rows) {
        float* out = p.logits + static_cast<int64_t>(g_row0 + r) * p.stride;
        if (t == 0 && pos0 < n_r[r]) out[pos0] = s0;
        if (t == 1 && pos0 + 8 < n_r[r]) out[pos0 + 8] = s1;
      }
    };
    if (!per_block) {
      // ---- fast route: A fragments, k-slice j = elements 8j..8j+7 of block
      // t scaled by 2^-s; one chain C = K' . Q'^T over four k32 slices ------
      const uint2 lut0 = E5m2Table(min(emax0 - ((sc0 >> (8 * t)) & 0xffu), kMaxShift));
      const uint2 lut1 = E5m2Table(min(emax1 - ((sc1 >> (8 * t)) & 0xffu), kMaxShift));
      uint32_t a[4][4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        WidenE2m1x8(Word(v0, j), lut0, a[j][0], a[j][2]);
        WidenE2m1x8(Word(v1, j), lut1, a[j][1], a[j][3]);
      }
      float acc[kN / 2];
      WgmmaFence();
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // +32 bytes per slice: +2 in the descriptor's 16-byte address units.
        WgmmaE5m2RegA<kN>(acc, a[j], DescPlus(desc_q, 2 * j), j == 0);
      }
      WgmmaCommit();
      // The lane's entry's power (its share of the sums, below).
      const float rs = format_internal::ExactPow2(static_cast<int32_t>((t & 1) != 0 ? emax1 : emax0) - 127);
      if (more) fetch(n + kMath, cur);  // under the wgmmas (they read a and Q only)
      WgmmaWaitAll();
      float2 part[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) part[r] = ReluWeightedHeadPartials<kHeads>(acc, w_s, r, t);
      const float v = QuadTransposedSums<kRows>(part, t).x;
      const int32_t pos = pos0 + 8 * (t & 1);
      if (pos < lane_n) lane_out[pos] = v * rs;
    } else {
      // ---- per-block route: chain b sees block b only (the quad's lane b
      // keeps its bytes, unscaled; the others give zeros), per query row r
      // and slice hf of its heads (N = kPb <= 32 keeps the registers down) --
      constexpr int kPb = kHeads < 32 ? kHeads : 32;
      const uint2 lut = E5m2Table(0u);
#pragma unroll 1
      for (int r = 0; r < kRows; ++r) {
        float s0 = 0.f, s1 = 0.f;
#pragma unroll 1
        for (int hf = 0; hf < kHeads / kPb; ++hf) {
          const int h0 = r * kHeads + hf * kPb;  // first head (column) of the slice
          const uint64_t desc_h = DescPlus(desc_q, (h0 * kMxDim) >> 4);
          float tot[kPb / 2];
#pragma unroll
          for (int i = 0; i < kPb / 2; ++i) tot[i] = 0.f;
#pragma unroll 1
          for (int b = 0; b < 4; ++b) {
            uint32_t ab[4][4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const uint32_t w0 = t == b ? Word(v0, j) : 0u, w1 = t == b ? Word(v1, j) : 0u;
              ab[j][0] = WidenE2m1x4(w0, lut);
              ab[j][1] = WidenE2m1x4(w1, lut);
              ab[j][2] = WidenE2m1x4(w0 >> 16, lut);
              ab[j][3] = WidenE2m1x4(w1 >> 16, lut);
            }
            float part[kPb / 2];
            WgmmaFence();
#pragma unroll
            for (int j = 0; j < 4; ++j) WgmmaE5m2RegA<kPb>(part, ab[j], DescPlus(desc_h, 2 * j), j == 0);
            WgmmaCommit();
            WgmmaWaitAll();
            // P_b exact in part; scaled by powers of two, then summed in fp32.
            const float sk0 = format_internal::ExactPow2(static_cast<int32_t>((sc0 >> (8 * b)) & 0xffu) - 127);
            const float sk1 = format_internal::ExactPow2(static_cast<int32_t>((sc1 >> (8 * b)) & 0xffu) - 127);
#pragma unroll
            for (int i = 0; i < kPb / 8; ++i) {
              const float* sq = sq_s + (h0 + 8 * i + 2 * t) * 4 + b;
              const float f0 = sq[0], f1 = sq[4];  // columns 8i + 2t, + 1
              tot[4 * i + 0] = fmaf(part[4 * i + 0], sk0 * f0, tot[4 * i + 0]);
              tot[4 * i + 1] = fmaf(part[4 * i + 1], sk0 * f1, tot[4 * i + 1]);
              tot[4 * i + 2] = fmaf(part[4 * i + 2], sk1 * f0, tot[4 * i + 2]);
              tot[4 * i + 3] = fmaf(part[4 * i + 3], sk1 * f1, tot[4 * i + 3]);
            }
          }
#pragma unroll
          for (int i = 0; i < kPb / 8; ++i) {
            const float2 w = *reinterpret_cast<const float2*>(w_s + h0 + 8 * i + 2 * t);
            s0 = fmaf(tot[4 * i] + fabsf(tot[4 * i]), w.x, fmaf(tot[4 * i + 1] + fabsf(tot[4 * i + 1]), w.y, s0));
            s1 = fmaf(tot[4 * i + 2] + fabsf(tot[4 * i + 2]), w.x, fmaf(tot[4 * i + 3] + fabsf(tot[4 * i + 3]), w.y, s1));
          }
        }
        s0 += ShflXor(s0, 1);
        s0 += ShflXor(s0, 2);
        s1 += ShflXor(s1, 1);
        s1 += ShflXor(s1, 2);
        store(r, s0, s1);
      }
      if (more) fetch(n + kMath, cur);
    }
  }
  // (One mark after the loop, not one a tile: a mark in the loop cost an
  // 8-byte spill at H 64 next_n 2, ptxas. Nothing follows the last tile.)
  TraceScoredAll(trace(tid == 0), wg < total ? (total - wg + kMath - 1) / kMath : 0);
  TraceMathEnd(trace(tid == 0));
#endif  // INDEXER_GPU_WGMMA
}

// kGather: the gather walk, in kGatherStages slots per warpgroup.
// The gather walk's ring: four slots per math warpgroup (12 x 4.25 KiB at
// three warpgroups). With per-lane bulk copies eight measured slower (H200,
// V4.1 B=64 128k consumer: logits 157.4 us at 8, 148.5 at 4): that walk was
// bound by its one producer warp's issue rate, not by bytes in flight; the
// cp.async fill took it to 93.7 us (h200_2026-12-02_kgather2.md).
constexpr int kGatherStages = 4;

template <int kHeads, int kRows, int kMath, bool kGather = false>
absl::Status LaunchMx(const LogitsParams& p, Stream stream) {
  constexpr int kStages = kGather ? kGatherStages : kRows == 1 ? 3 : 4;
  using C = MxConfig<kHeads, kRows, kMath, kStages, MxProducers<kGather>()>;
  auto* kernel = &DenseLogitsWgmmaMxfp4Kernel<kHeads, kRows, kMath, kStages, kGather>;
  // Once per device (per_device.h): the shared-memory limit and the blocks
  // per SM (host calls that would otherwise sit between the timing events).
  static PerDevice<absl::StatusOr<int>> setup;
  const absl::StatusOr<int> per_sm = setup.Get([&]() -> absl::StatusOr<int> {
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, C::kSmem));
    int n = 0;
    GPU_RETURN_IF_ERROR(MaxActiveBlocksPerSm(&n, kernel, C::kThreads, C::kSmem));
    return std::max(n, 1);
  });
  if (!per_sm.ok()) return per_sm.status();
  const int64_t grid = std::min<int64_t>(p.unit_end - p.unit_begin, static_cast<int64_t>(*per_sm) * p.num_sms);
  GPU_LAUNCH(kernel, static_cast<int>(grid), C::kThreads, C::kSmem, stream, p);
  return absl::OkStatus();
}

// Math warpgroups of the one block per SM: four for H 64's one-row dense
// walk (N = 64, 96 registers, no spills), three for H 32 and 16, the gather
// walk and N = 128 (two rows; 128 registers). INDEXER_GPU_MXFP4_WARPGROUPS
// picks 3 or 4 for one row, 2 or 3 for two (A/B runs). H200, session 17
// (before the fetch under the wgmma): N = 64 at 4 B=64 x 32k 107-109 us
// against 113-114 at 3 in that call, B=128 x 128k 717-719 against 721-724,
// the V4.1 dense H 32 128k 334-335 against 328-331; N = 128 (next_n 2) 173
// at 2 against 141-144 at 3. H100, session 33, same call, two rounds (the
// fetch under the wgmma): H 64 at 4 B=64 x 32k -3.7 us, B=128 x 128k -4.3;
// H 32 -0.5, H 16 +0.3 (noise).
int MxWarpgroups(int rows, int heads, bool gather) {
  const int env = Knobs().mxfp4_warpgroups;
  if (rows == 1) {
    if (env == 3 || env == 4) return env;
    return heads == 64 && !gather ? 4 : 3;
  }
  return env == 2 ? 2 : 3;
}

}  // namespace

bool WgmmaMxfp4Supported(const LogitsParams& p, int cc_major, int cc_minor) {
  const PageLayout& l = p.layout;
  return cc_major == 9 && cc_minor == 0 && l.format == KvFormat::kMxfp4 && l.head_dim == kMxDim &&
         !l.tiled() && l.page_entries % kMxTile == 0 && l.page_bytes() % 16 == 0 &&
         MmaHeadsSupported(p.num_heads) && p.max_group_rows >= 1 && p.max_group_rows <= 2 &&
         p.q_scales != nullptr;
}

bool WgmmaMxfp4Enabled() {
  // INDEXER_GPU_WGMMA_MXFP4=0 leaves MXFP4 on the mma.sync kernel (A/B runs; knobs.h).
  return Knobs().wgmma_mxfp4;
}

absl::Status LaunchDenseLogitsWgmmaMxfp4(const LogitsParams& p, Stream stream) {
  if (p.unit_end == p.unit_begin) return absl::OkStatus();
  if (!WgmmaMxfp4Supported(p, 9, 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MXFP4 wgmma logits: expected linear MXFP4 pages of a multiple of 64 entries, D = 128, "
        "H = 16, 32 or 64 and groups of <= 2 rows, got ", p.layout.DebugString(), ", H ", p.num_heads,
        ", ", p.max_group_rows, " rows"));
  }
  return DispatchMmaHeads(p.num_heads, [&](auto h) -> absl::Status {
    constexpr int kHeads = decltype(h)::value;
    if (p.max_group_rows <= 1) {
      return MxWarpgroups(1, kHeads, false) == 3 ? LaunchMx<kHeads, 1, 3>(p, stream)
                                                 : LaunchMx<kHeads, 1, 4>(p, stream);
    }
    return MxWarpgroups(2, kHeads, false) == 2 ? LaunchMx<kHeads, 2, 2>(p, stream)
                                               : LaunchMx<kHeads, 2, 3>(p, stream);
  });
}

bool WgmmaMxfp4GatherSupported(const LogitsParams& p, int cc_major, int cc_minor) {
  const PageLayout& l = p.layout;
  return cc_major == 9 && cc_minor == 0 && l.format == KvFormat::kMxfp4 && l.head_dim == kMxDim &&
         !l.tiled() && l.page_entries % kMxTile == 0 && l.page_bytes() % 16 == 0 &&
         MmaHeadsSupported(p.num_heads) && p.max_group_rows == 1 && p.gather_block >= kMxBoxEntries &&
         p.gather_block % kMxBoxEntries == 0;
}

absl::Status LaunchDenseLogitsWgmmaMxfp4Gather(const LogitsParams& p, Stream stream) {
  if (p.unit_end == p.unit_begin) return absl::OkStatus();
  if (!WgmmaMxfp4GatherSupported(p, 9, 0) || p.q_scales == nullptr || p.gather_blocks == nullptr ||
      p.gather_entries == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MXFP4 gather walk: expected linear MXFP4 pages of a multiple of 64 entries, D = 128, H = 16, 32 "
        "or 64, groups of 1 row, Q scales, pool entries and pool blocks of a multiple of ", kMxBoxEntries,
        " entries, got ", p.layout.DebugString(), ", H ", p.num_heads, ", ", p.max_group_rows, " rows, block ",
        p.gather_block));
  }
  // Three math warpgroups, or four with INDEXER_GPU_MXFP4_WARPGROUPS=4 (A/B
  // runs; MxWarpgroups).
  return DispatchMmaHeads(p.num_heads, [&](auto h) -> absl::Status {
    constexpr int kHeads = decltype(h)::value;
    return MxWarpgroups(1, kHeads, true) == 3 ? LaunchMx<kHeads, 1, 3, true>(p, stream)
                                              : LaunchMx<kHeads, 1, 4, true>(p, stream);
  });
}

}  // namespace gpu
}  // namespace indexer
