// The dense walk's producer side: a block's share of plan units, walked in
// 64-entry K tiles a window of kWarpSize tiles at a time by one whole warp,
// lane i holding tile i of the window (its group and the group's rows, its
// first entry, unit end, page and entry in the page).
//
// Why a window: a producer that walks tile by tile puts a dependent load
// (the tile's block-table entry, at a unit's start the next unit) and the
// tile's address arithmetic between two of its copies. On the H200 that
// walk was the ws kernels' limit (ncu source view, B=64 32k: the MXFP4
// producer ~100 dependent instructions per tile, the consumers idle 33 %
// of their samples on `full`; the FP8 producer's samples on its unit and
// block-table loads). Here the warp does the lookups of 32 tiles at once
// and the caller issues them from registers (a shuffle each); Next()
// leaves its block-table loads in flight, and the units of the window
// after it, so a caller that asks for window w + 1 before issuing window w
// waits on no load between two copies.
//
// Units: LogitsUnit of the plan (kernels/gpu/plan.h), none empty, starting
// at multiples of 64 entries; pages hold whole tiles (page_entries % 64 == 0).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {

constexpr int kWindowTile = 64;  // entries per K tile

// Lane i < count: tile i of a window.
struct TileWindow {
  int32_t count;  // tiles in the window (the same in every lane); 0: the share is done
  int32_t group, first, end;  // the tile's group, first entry and its unit's end
  int32_t row_begin, num_rows;  // its group's first row (step row) and rows
  int32_t page, e;            // its physical page (a load, in flight) and entry in the page
  // Tile 0's page when it starts its unit (the unit's page0, >= 0; else
  // -1): the window's first copy need not wait on its block-table loads.
  int32_t lead;
};

// A unit as the walk loads it, two 16-byte loads: {group, e_begin, e_end,
// seq} and {row_begin, num_rows, page0, pad}.
static_assert(offsetof(LogitsUnit, group) == 0 && offsetof(LogitsUnit, e_begin) == 4 &&
                  offsetof(LogitsUnit, e_end) == 8 && offsetof(LogitsUnit, seq) == 12 &&
                  offsetof(LogitsUnit, row_begin) == 16 && offsetof(LogitsUnit, num_rows) == 20 &&
                  offsetof(LogitsUnit, page0) == 24 && sizeof(LogitsUnit) == 32,
              "LogitsUnit is {group, e_begin, e_end, seq, row_begin, num_rows, page0, pad}");

class TileWalk {
 public:
  // REQUIRES: u_first < u_last; every lane of the warp constructs it.
  __device__ TileWalk(const LogitsParams& p, int32_t u_first, int32_t u_last)
      : p_(p), cu_(u_first), ct_(0), u_last_(u_last) {
    Load();
  }

  // The next window; every lane calls it (shuffles and a ballot).
  __device__ TileWindow Next() {
    TileWindow w;
    w.group = w.first = w.end = w.row_begin = w.num_rows = w.page = w.e = 0;
    w.lead = -1;
    if (cu_ >= u_last_) {
      w.count = 0;
      return w;
    }
    const int lane = LaneId();
    const int4 u = unit_;   // lane j: unit cu_ + j {group, e_begin, e_end, seq}
    const int4 u2 = unit2_;  // {row_begin, num_rows, page0, pad}
    const int32_t page0 = ShflIdx(u2.z, 0);
    if (ct_ == 0) w.lead = page0;
    const bool has = cu_ + lane < u_last_;
    const int32_t tiles = has ? (u.z - u.y + kWindowTile - 1) / kWindowTile : 0;
    // Inclusive scan of the units' tiles from the cursor's (less the tiles
    // of unit cu_ already walked): incl_j = tiles before the end of unit j.
    int32_t incl = tiles;
#pragma unroll
    for (int d = 1; d < kWarpSize; d <<= 1) {
      const int32_t v = ShflIdx(incl, lane >= d ? lane - d : 0);
      if (lane >= d) incl += v;
    }
    incl -= ct_;
    const int32_t excl = incl - tiles;  // tiles before unit j (lane 0: -ct_)
    const int32_t total = ShflIdx(incl, kWarpSize - 1);
    w.count = total < kWarpSize ? total : kWarpSize;
    // Lane i's unit: j = the units that end at or before tile i (the keys
    // are non-decreasing; lanes past the share never count).
    const int32_t key = has ? incl : 0x7fffffff;
    int j = 0;
#pragma unroll
    for (int s = kWarpSize / 2; s >= 1; s >>= 1) {
      if (ShflIdx(key, j + s - 1) <= lane) j += s;
    }
    const int32_t group = ShflIdx(u.x, j), e_begin = ShflIdx(u.y, j), e_end = ShflIdx(u.z, j);
    const int32_t seq = ShflIdx(u.w, j), before = ShflIdx(excl, j);
    const int32_t row_begin = ShflIdx(u2.x, j), num_rows = ShflIdx(u2.y, j);
    if (lane < w.count) {
      w.group = group;
      w.first = e_begin + (lane - before) * kWindowTile;
      w.end = e_end;
      w.row_begin = row_begin;
      w.num_rows = num_rows;
      const PagePos at = PagePosOf(p_.layout, w.first);
      w.page = p_.step.block_table[static_cast<int64_t>(seq) * p_.step.max_pages + at.lp];
      w.e = at.e;
    }
    // The cursor to the window's end: units that end at or before it are
    // behind; the next window starts inside unit cu_ + done.
    const int done = PopCount64(Ballot(has && incl <= w.count));
    const int32_t next_before = ShflIdx(excl, done < kWarpSize ? done : 0);
    ct_ = done < kWarpSize ? w.count - next_before : 0;
    cu_ += done;
    Load();
    return w;
  }

 private:
  // Lane j: unit cu_ + j (clamped to the share's last), a load left in flight.
  __device__ void Load() {
    const int32_t i = cu_ + LaneId() < u_last_ ? cu_ + LaneId() : u_last_ - 1;
    const int4* at = reinterpret_cast<const int4*>(p_.step.units + i);
    unit_ = at[0];
    unit2_ = at[1];
  }

  const LogitsParams& p_;
  int32_t cu_, ct_, u_last_;  // the cursor: unit, tiles of it walked; the share's end
  int4 unit_, unit2_;
};

// The producer's loop: window w + 1 is looked up before window w's tiles go
// out, unrolled by two so that no register copy waits on a load in flight.
// lead(w) issues tile 0 of w from w.lead when it can (returns 1; else 0),
// rest(w, i0) tiles i0.. of w; tile 0 of every window goes out before the
// next lookup waits on the units it loaded.
//
// The callers' lead and rest: the whole warp waits for a tile's ring slot,
// then lane 0 issues its copies, so the warp stays converged. (With lane 0
// waiting alone, the other lanes ran ahead into the next shuffle and the
// warp split between the try-wait loop and the shuffle's divergent path at
// every full ring: H200 ncu, FP8 B=64 32k, 107 us against 94 for the walk
// lane 0 made alone before, 88.8-90.5 converged.)
template <class Lead, class Rest>
__device__ __forceinline__ void WalkWindows(TileWalk& walk, Lead&& lead, Rest&& rest) {
  TileWindow a = walk.Next();
  int ia = lead(a);
  for (;;) {
    const TileWindow b = walk.Next();
    rest(a, ia);
    if (b.count == 0) break;
    const int ib = lead(b);
    a = walk.Next();
    rest(b, ib);
    if (a.count == 0) break;
    ia = lead(a);
  }
}

}  // namespace gpu
}  // namespace indexer
