// Kernel parameter structs and host launchers of the gpu backend. Plain
// types only, so host files include this without a device compiler. Every
// launcher enqueues on `stream`, checks the launch and returns its status.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/format/page_layout.h"
#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/plan.h"
#include "kernels/gpu/trace_record.h"

namespace indexer {
namespace gpu {

// Device copies of a step's geometry (StepRows), shared by its layers.
struct DeviceStepRows {
  int32_t num_seqs;
  int32_t num_rows;
  int32_t max_pages;
  const int32_t* block_table;   // [num_seqs, max_pages] page, -1 past end
  const int32_t* seq_old;       // [num_seqs] entries before the step
  const int32_t* seq_k_begin;   // [num_seqs + 1] first K row per sequence
  const int32_t* row_visible;   // [num_rows] n_r
  const LogitsGroup* groups;    // [plan groups]
  const LogitsUnit* units;      // [plan units]
  const int32_t* row_seq;       // [num_rows] sequence of each row
};

// ---- K write ---------------------------------------------------------------
enum class KSource : int32_t { kFloat32 = 0, kBf16 = 1, kQuantized = 2 };

struct WriteParams {
  PageLayout layout;
  uint8_t* pool;           // the layer's pool, page-contiguous
  DeviceStepRows step;
  int32_t entry_base;      // first K row of this launch (staged in pieces)
  int32_t num_entries;     // K rows of this launch
  KSource source;
  bool ue8m0;
  // kFloat32: [n, D] fp32; kBf16: [n, D] bf16 bits; kQuantized: [n, VB + SB]
  // linear entries; row 0 is K row entry_base.
  const void* src;
};

absl::Status LaunchWriteEntries(const WriteParams& p, Stream stream);

// ---- device input checks -----------------------------------------------------
// Finiteness of an input that lives in device memory (the host never sees
// its bytes): *first_bad = min(*first_bad, index of each bad element).
enum class CheckKind : int32_t {
  kFloat32,      // fp32 elements: NaN / Inf
  kBf16,         // bf16 elements: NaN / Inf
  kQuantized,    // linear entries of `layout`: e4m3 NaN codes and fp32
                 // scales not finite > 0 (FP8), e8m0 0xff scales (MXFP4)
  kFp8Codes,     // bytes: NaN codes of layout.fp8 (e4m3fn 0x7f / 0xff,
                 // e4m3fnuz 0x80)
  kE8m0,         // bytes: 0xff (the e8m0 NaN)
};
// The verdict words of a call's checks: k, weights, q (FP8 codes), q_scale
// (e8m0); 0xffffffff = no bad element.
constexpr int kCheckSlots = 4;
// One tensor to check: its first bad element's index lowers its slot.
struct CheckPart {
  const void* src;
  int64_t count;  // elements (kFloat32 / kBf16 / bytes) or entries (kQuantized)
  CheckKind kind;
  int32_t slot;      // its verdict word, < kCheckSlots
  int32_t per_unit;  // elements per thread unit (LaunchCheckInput sets it)
};
// Up to kMaxCheckParts tensors in one launch (a layer's device weights, Q
// values and Q scales cost one kernel, not three).
constexpr int kMaxCheckParts = 3;
struct CheckParams {
  CheckPart parts[kMaxCheckParts];
  int32_t num_parts;
  // Blocks [block_begin[k], block_begin[k + 1]) check part k
  // (LaunchCheckInput sets them).
  int32_t block_begin[kMaxCheckParts + 1];
  PageLayout layout;
  // [kCheckSlots + 1] device words: each slot's first bad element so far
  // (0xffffffff between launches), then the count of blocks done (0 between
  // launches). The launch's last block publishes the slots to `verdict` and
  // puts both back, so a launch needs no reset before it and no copy after.
  uint32_t* state;
  // [kCheckSlots] mapped pinned host words (their device address), written
  // by the last block; the host reads them after the stream's wait.
  uint32_t* verdict;
};
absl::Status LaunchCheckInput(const CheckParams& p, Stream stream);

// ---- dense logits ----------------------------------------------------------
struct LogitsParams {
  // The pool as [pages, E, 128] for the bulk tensor copy engine (FP8,
  // linear pages of a multiple of 64 entries, sm_90); else use_tma false.
  TensorMap tmap;
  bool use_tma;
  PageLayout layout;
  const uint8_t* pool;
  DeviceStepRows step;
  int32_t unit_begin;        // the sub-chunk's units [unit_begin, unit_end)
  int32_t unit_end;
  int32_t row_base;          // first step row of the sub-chunk
  int32_t num_heads;         // H
  int32_t max_group_rows;    // largest group (sizes shared memory)
  int32_t num_sms;           // multiprocessors (persistent grids)
  const uint8_t* q_values;   // [rows, H, VB] e4m3 / packed e2m1 (sub-chunk)
  const uint8_t* q_scales;   // [rows, H, D/32] e8m0 (MXFP4), else null
  const float* weights;      // [rows, H] fp32
  float* logits;             // [rows, stride]; row r valid on [0, n_r)
  int64_t stride;
  // Consumer gather (gather_logits.h: LaunchGatherLogits runs the
  // warp-specialized or the serial wgmma kernel; groups of one row): a
  // unit's entries are pool slots of its row. Slot j of step
  // row r is entry gather_blocks[r * gather_stride + j / gather_block] *
  // gather_block + j % gather_block for j < gather_entries[r]; its logit is
  // written at column j (compact rows), and n_r is gather_entries[r].
  const int32_t* gather_blocks = nullptr;
  const int32_t* gather_entries = nullptr;
  int32_t gather_stride = 0;
  int32_t gather_block = 0;
  // Fused first pass of the cooperative top-k (TopkParams::hist_ready):
  // kernels that can (LogitsFillTopkHist) add each row's key histogram
  // (top 11 bits of the ordered keys of [0, n_r)) to topk_hist[row *
  // kTopkStateWords ..+ 2048] (the top-k's zeroed row state, sub-chunk
  // rows), rows with n_r <= topk_min_visible left out. Null: no histogram.
  uint32_t* topk_hist = nullptr;
  int32_t topk_min_visible = 0;
  // The device's L2 bytes (0: unknown). The ws launcher hints evict-first
  // only where the step's logits fit it (the lines the hint keeps for the
  // top-k's read).
  int64_t l2_bytes = 0;
  // Set by the ws launcher: K copies with the L2 evict-first policy (where
  // the step reads K once and its logits fit the L2, unless env
  // INDEXER_GPU_WS_EVICT_FIRST=0; =2 past the L2 too).
  bool k_evict_first = false;
  // Set by the ws launcher (env INDEXER_GPU_LOGITS_PDL=1): every block lets
  // the stream's next kernel (the top-k, launched after-previous) be placed
  // once the block has set up, rather than at the grid's end; the top-k
  // waits for the logits before it reads them (GridDependencyWait).
  bool launch_dependents = false;
  // The ws kernel's claimed tail (dense walk; plan.h: TailRule): the last
  // tail_units units of [unit_begin, unit_end) are not split over the
  // blocks; each block's producer, its share done, claims a few of them at
  // a time from claims[0], until a claim comes back past the end.
  // claims ([2]: claims, blocks done) are the backend's, 0 between
  // launches: the launch's last block sets them back. The launcher sets
  // tail_units by `tail` where claims is not null.
  int32_t* claims = nullptr;
  TailRule tail;
  int32_t tail_units = 0;
  // The bench's timeline (trace_record.h: TraceWord); null in production.
  uint64_t* trace = nullptr;
  int32_t trace_blocks = 0;
};

// The fastest path the device, format, layout and H allow: "wgmma_ws" or
// "wgmma" (sm_90a, FP8 e4m3fn), "wgmma_mxfp4" (sm_90a, MXFP4), "mma" (sm_89+
// mma.sync, FP8 e4m3fn and MXFP4) or "portable" (any, e4m3fnuz caches
// included); `which` (may be null) gets its
// name. `max_path` caps it (tests compare the paths): 0 portable, 1 mma,
// 2 wgmma (any form).
absl::Status LaunchDenseLogits(const LogitsParams& p, int cc_major,
                               int cc_minor, Stream stream,
                               const char** which = nullptr, int max_path = 2);
// True when the kernel LaunchDenseLogits ran for `p` (named `which`) added
// the rows' histograms to p.topk_hist (the top-k may skip its first pass).
bool LogitsFillTopkHist(const LogitsParams& p, const char* which);
// The wave64 MFMA kernels (kernels/gpu/amd/logits_mfma.cu; `arch` 942 or
// 950): FP8 on gfx942 (e4m3fnuz operands) and gfx950 (OCP e4m3), MXFP4 on
// gfx950 (scaled FP4 MFMA); D = 128, H <= 64, any layout. On CUDA they run
// through the instruction model of the compat seam. LaunchDenseLogits takes
// them on a gfx942 / gfx950 device (max_path >= 1) and, on CUDA, for
// max_path kPathMfmaGfx942 / kPathMfmaGfx950 (tests: as that device would,
// portable where its MFMA kernel does not take `p`) or where env
// INDEXER_GPU_MFMA_MODEL=gfx942|gfx950 is set (default max_path).
inline constexpr int kPathMfmaGfx942 = 3;
inline constexpr int kPathMfmaGfx950 = 4;
bool MfmaLogitsSupported(const LogitsParams& p, int arch);
// The arch (942, 950) whose MFMA kernel LaunchDenseLogits runs for `p`, 0 none.
int MfmaLogitsArch(const LogitsParams& p, int cc_major, int cc_minor, int max_path);
// "mfma_gfx942" / "mfma_gfx950" (HIP), "mfma_model_gfx942" / "mfma_model_gfx950" (CUDA).
const char* MfmaPathName(int arch);
absl::Status LaunchDenseLogitsMfma(const LogitsParams& p, int arch, Stream stream);
// The portable kernel alone (any layout, H, D; HIP and CUDA).
absl::Status LaunchDenseLogitsPortable(const LogitsParams& p, Stream stream);
// True when a pool of `layout` on a device of compute major `cc_major` gets a
// tensor map (LogitsParams::tmap) for the sm_90 bulk-copy paths.
bool PoolWantsTensorMap(const PageLayout& layout, int cc_major);
// True when a pool of `layout` gets the block path's tensor map
// (BlockScoreParams::tmap): [pages, E, VB] in boxes of one page's values,
// 64-byte swizzle.
bool BlockPoolWantsTensorMap(const PageLayout& layout, int cc_major);

// ---- the sm_90 paths of hopper/ --------------------------------------------
// Defined in CUDA builds only (kernels/gpu/hopper/ is not in a HIP build):
// name them only where kHopperPaths is known true at compile time
// (logits_dispatch.cc), so a HIP build holds no reference to them.
// True when LaunchDenseLogitsMma accepts `p` on a device of this capability.
bool MmaLogitsSupported(const LogitsParams& p, int cc_major, int cc_minor);
absl::Status LaunchDenseLogitsMma(const LogitsParams& p, Stream stream);
// Hopper warpgroup-MMA FP8 path (sm_90a), H = 16, 32 or 64. Pools of
// layouts that pass WgmmaTmaSupported get a tensor map (use_tma) and stream
// K through the bulk tensor copy engine; other layouts, and the consumer's
// gather walk where the warp-specialized one does not take it
// (gather_logits.h), through cp.async.
bool WgmmaTmaSupported(const PageLayout& layout);
bool WgmmaLogitsSupported(const LogitsParams& p, int cc_major, int cc_minor);
absl::Status LaunchDenseLogitsWgmma(const LogitsParams& p, Stream stream);
// Its warp-specialized form (TMA producer warp + teams of math warpgroups
// over an mbarrier ring): tensor-mapped pools, groups of any size up to
// kMaxGroupRows (decode and prefill). On by default; env
// INDEXER_GPU_WGMMA_WS=0 turns it off.
bool WgmmaWsEnabled();
bool WgmmaWsSupported(const LogitsParams& p);
absl::Status LaunchDenseLogitsWgmmaWs(const LogitsParams& p, Stream stream);
// True when LaunchDenseLogitsWgmmaWs fills p.topk_hist for `p` (one row per
// warpgroup: H 64 groups of <= 2 rows). Env INDEXER_GPU_TOPK_FUSE=0 turns
// the fused histogram off (A/B runs).
bool WgmmaWsFillsTopkHist(const LogitsParams& p);
// Hopper warpgroup-MMA MXFP4 path (sm_90a, logits_mxfp4_ws.cu): linear
// pages of a multiple of 64 entries, D = 128, H = 16, 32 or 64, groups of
// <= 2 rows (decode); K streamed by bulk copies and widened to e5m2 in
// registers. On by default; env INDEXER_GPU_WGMMA_MXFP4=0 turns it off.
bool WgmmaMxfp4Enabled();
bool WgmmaMxfp4Supported(const LogitsParams& p, int cc_major, int cc_minor);
absl::Status LaunchDenseLogitsWgmmaMxfp4(const LogitsParams& p, Stream stream);

// ---- top-k -----------------------------------------------------------------
struct TopkParams {
  const float* logits;       // [rows, stride] fp32
  int64_t stride;
  const int32_t* row_visible;  // [rows] n_r (device, sub-chunk rows)
  int32_t num_rows;
  int32_t topk;
  int32_t* out;              // [rows, topk] int32 device, -1 = no entry
  // Cooperative path (cand_stride > 0): `slices` blocks of `slice_len`
  // entries per row, per-row state [rows, kTopkStateWords] and candidate
  // buffers [rows, cand_stride]. cand_stride == 0: one block per row.
  int32_t slices;
  int32_t slice_len;
  int64_t cand_stride;
  uint32_t* state;
  uint32_t* cand_keys;
  int32_t* cand_pos;
  // Cooperative path only: the rows' histograms are already in `state`
  // (the logits kernel filled them, LogitsFillTopkHist): one launch, no
  // histogram pass.
  bool hist_ready = false;
  // Cooperative path only: stage B's register cap in blocks per SM, 1
  // (uncapped, 64 registers), 3 (40) or 4 (32); PlanTopkSplit picks it from
  // the launch's blocks per multiprocessor (TopkEmitCap).
  int32_t emit_cap = 1;
  // By rows (cand_stride == 0): threads per block, 512 or 1024
  // (PlanTopkSplit: 1024 up to one row per SM).
  int32_t row_threads = 512;
  // Candidate consumers: the rows' positions are slots of their pools, and
  // `out` gets the entries the slots hold (TopkOutPos). Null: positions are
  // entries.
  const int32_t* pool_blocks = nullptr;  // [rows, pool_stride] ascending block ids
  int64_t pool_stride = 0;
  int32_t pool_block = 0;                // entries per block
};

// What the top-k writes for position i of row r: the entry slot i of the
// row's pool holds (kPool: the kernels' instantiation for pool_blocks set;
// PoolSlotEntry, step geometry), else i. A compile-time choice: with the
// pool's test and division in every top-k the dense path's top-k took
// 3.8 us more at B=1 x 128k (H100, s39; its PTX grew by a third).
template <bool kPool>
INDEXER_HD int32_t TopkOutPos(const TopkParams& p, int32_t row, int32_t i) {
  if constexpr (kPool) {
    return PoolSlotEntry(p.pool_blocks + row * p.pool_stride, p.pool_block, i);
  } else {
    return i;
  }
}

// Entries a top-k block keeps in shared memory.
inline constexpr int32_t kTopkCache = 8192;
// 32-bit words of cooperative state per row (histogram and counters).
inline constexpr int32_t kTopkStateWords = 2048 + 8;

// Chooses the path for `num_rows` rows of up to `max_visible` entries on
// `num_sms` multiprocessors with room for `cand_capacity` candidates.
void PlanTopkSplit(int32_t num_rows, int32_t max_visible, int32_t topk,
                   int32_t num_sms, int64_t cand_capacity, TopkParams* p);
// Stage B's register cap for a launch of `blocks` on `num_sms`
// multiprocessors: 1 up to 2 blocks per SM, 3 up to 3, else 4
// (INDEXER_GPU_TOPK_BLOCKS_PER_SM overrides).
int32_t TopkEmitCap(int64_t blocks, int32_t num_sms);
absl::Status LaunchTopk(const TopkParams& p, Stream stream);

// ---- candidate and block paths (paths_kernels.cu) ---------------------------
// Source: block maxima in place, logits[r, b] = max over candidate block b of
// row r (b < ceil(n_r / block_size)); num_blocks[r] gets that count.
struct BlockMaxParams {
  float* logits;             // [rows, stride]
  int64_t stride;
  const int32_t* row_visible;  // [rows] n_r
  int32_t num_rows;
  int32_t block_size;
  int32_t* num_blocks;       // [rows] out
  // Out of place: the maxima to [rows, maxima_stride] (a multiple of 4),
  // a grid of (row, 256 blocks) pieces. Null: in place over the logits,
  // one thread block per row (where the workspace has no room for them).
  float* maxima = nullptr;
  int64_t maxima_stride = 0;
};
// max_blocks: the most blocks of any row (the out-of-place grid's width).
absl::Status LaunchBlockMaxima(const BlockMaxParams& p, int32_t max_blocks, Stream stream);

// Source: each row's pool from the top-k selection over its maxima.
struct PoolParams {
  const int32_t* sel;        // [rows, sel_stride] chosen block ids (rows of nb > k)
  int64_t sel_stride;
  const float* maxima;       // [rows, stride] block maxima
  int64_t stride;
  const int32_t* row_visible;  // [rows] n_r
  int32_t num_rows;
  int32_t topk_blocks;       // k
  int32_t block_size;
  bool pin_newest;
  int32_t* blocks;           // [rows, k] ascending block ids, -1 past the pool
  int32_t* entries;          // [rows] pool entries below n_r
};
// `max_blocks` bounds ceil(n_r / block_size) over the rows (shared memory).
absl::Status LaunchFinishPool(const PoolParams& p, int32_t max_blocks, Stream stream);

// Consumer's masked walk: rows whose pool holds more than topk entries get
// the pool's logits compacted, in place, to slots [0, entries); the other
// rows are left as they are (the top-k lists their pools whole, reading no
// logits: TopkParams::pool_blocks).
struct PoolGatherParams {
  float* logits;             // [rows, stride]
  int64_t stride;
  const int32_t* blocks;     // [rows, topk_blocks] the pool
  const int32_t* entries;    // [rows]
  int32_t num_rows;
  int32_t topk_blocks;
  int32_t block_size;
  int32_t topk;
};
absl::Status LaunchGatherPool(const PoolGatherParams& p, Stream stream);

// Block path (MXFP4 pages, block = page): scores [Hi, num_rows, width] of
// rows [row_base, row_base + num_rows), causal[h * num_rows + lr] = pages
// the row sees (the top-k's row lengths).
struct BlockScoreParams {
  PageLayout layout;
  const uint8_t* pool;
  DeviceStepRows step;
  int32_t row_base;
  int32_t num_rows;
  int32_t num_heads;         // Hi
  const float* q;            // [num_rows, Hi, D] fp32
  float scale;
  int32_t init_blocks;
  int32_t local_blocks;
  float* scores;
  int32_t width;             // >= max causal pages over the rows
  int32_t* causal;           // [Hi, num_rows] out
  // The pool's page-values map (BlockPoolWantsTensorMap): block_stream
  // copies a page's values by the bulk tensor copy engine in the 64-byte
  // swizzle, so that its value loads hit 32 banks.
  bool use_tma = false;
  TensorMap tmap{};
  // Set by the streaming kernel's launcher: page copies with the L2
  // evict-first policy (on unless env INDEXER_GPU_WS_EVICT_FIRST=0).
  bool evict_first = false;
  // Set by the streaming kernel's launcher (knob INDEXER_GPU_BLOCK_PREFETCH,
  // off by default): each group asks the L2 for its next page an item
  // before copying it.
  bool l2_prefetch = false;
  // The bench's timeline (trace_record.h: TraceWord); null in production.
  uint64_t* trace = nullptr;
  int32_t trace_blocks = 0;
};
absl::Status LaunchBlockScores(const BlockScoreParams& p, Stream stream);

// The block path's per-step work map (made once per step and page size by
// the host, plan.cc: PlanBlockWork; kept in the step's device memory): the
// rows' causal pages flattened, row r's pages b at flat index starts[r] + b,
// and per sub-chunk of the step's plan an even split of its flat range over
// the persistent kernel's CTAs.
struct BlockWorkMap {
  const int32_t* starts;     // [step rows + 1] exclusive prefix of causal pages
  const int32_t* cta;        // [ctas + 1][2] {first flat index, its row}; the
                             // last pair ends the sub-chunk's range
  int32_t ctas;              // grid of the launch
};

// The block path's kernel choice, the one place for it (logits_dispatch.cc):
// max_path >= 2 on sm_90 with a work map and a layout the streaming kernel
// takes: "block_stream"; max_path >= 1 on sm_89+: "block_mma"; otherwise
// "block_portable". `wm` may be null (no streaming kernel then).
// CTAs of the streaming kernel's work map on this device (0: the kernel
// cannot run here at this max_path; no map needed).
int32_t BlockWorkMapCtas(int cc_major, int32_t num_sms, int max_path);
absl::Status LaunchBlockScorePath(const BlockScoreParams& p, const BlockWorkMap* wm, int cc_major,
                                  int cc_minor, int32_t num_sms, Stream stream, int max_path,
                                  const char** which);

// Block top-k (paths_kernels.cu): one warp per (head, row), the top
// `topk` of the row's causal scores by a bitwise threshold search over
// their order keys in registers; rows of <= topk blocks give 0..causal-1
// then -1. Takes rows of at most BlockTopkMaxWidth() blocks.
struct BlockTopkParams {
  const float* scores;       // [Hi, num_rows, width] fp32
  int32_t width;
  const int32_t* causal;     // [Hi, num_rows] causal blocks of each row
  int32_t num_rows;
  int32_t num_heads;
  int32_t topk;
  int32_t* out;              // [Hi, num_rows, topk] int32, -1 = no block
};
int32_t BlockTopkMaxWidth();
absl::Status LaunchBlockTopk(const BlockTopkParams& p, Stream stream);

// ---- the sm_89+ / sm_90 block kernels of hopper/ (CUDA builds only; named
// only by LaunchBlockScorePath under kHopperPaths).
// mma.sync fp16 with Q split in two fp16 parts (block_scores_mma.cu): MXFP4,
// D = 128, Hi <= 8, 4-byte value chunks. Within the block path's tolerance
// of the portable kernel's fp32 sums, not bit-identical to them.
bool BlockScoresMmaSupported(const BlockScoreParams& p, int cc_major, int cc_minor);
absl::Status LaunchBlockScoresMma(const BlockScoreParams& p, int32_t num_sms, Stream stream);
// The same arithmetic as a persistent streaming kernel (sm_90,
// block_scores_stream.cu): CTAs walk the work map's (row, page) items,
// whole pages by bulk copies into per-warp rings. Pages of a multiple of 16
// bytes and of at most 128 entries.
bool BlockScoresStreamSupported(const BlockScoreParams& p, int cc_major, int cc_minor);
// Layouts whose pools block_stream reads through a tensor map (linear MXFP4
// pages it takes).
bool BlockScoresStreamTmaLayout(const PageLayout& layout);
// CTAs of the streaming kernel on a device of `num_sms` multiprocessors.
int32_t BlockScoresStreamCtas(int32_t num_sms);
absl::Status LaunchBlockScoresStream(const BlockScoreParams& p, const BlockWorkMap& wm, Stream stream);

}  // namespace gpu
}  // namespace indexer
