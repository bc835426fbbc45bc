#include "kernels/cpu/dense_logits.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"

namespace indexer {
namespace cpu_internal {
namespace {

// Entries decoded and scored together: the decoded block (D x kBlock fp32,
// 16 KiB at D = 128) stays in L1 while every row of the task reads it.
constexpr int kBlock = kEntryBlock;
static_assert(kBlock % 8 == 0, "the entry block is a whole number of vectors");
// Entries per task: enough work per task (H * D * kTaskEntries MACs per row)
// to hide scheduling, small enough to split one 8k-entry row over 16 cores.
constexpr int32_t kTaskEntries = 512;
static_assert(kTaskEntries % kBlock == 0, "tasks hold whole entry blocks");
// Rows of one sequence per task (decode rows of one sequence, or a slice of
// a prefill chunk); they reuse each decoded K block.
constexpr int32_t kTaskRows = 8;

// Decoded values of every e4m3fn and e4m3fnuz code and every e2m1 nibble.
struct DecodeTables {
  float e4m3[256];
  float e4m3fnuz[256];
  float e2m1[16];
  DecodeTables() {
    for (int c = 0; c < 256; ++c) e4m3[c] = DecodeE4m3(static_cast<uint8_t>(c));
    for (int c = 0; c < 256; ++c) e4m3fnuz[c] = DecodeE4m3fnuz(static_cast<uint8_t>(c));
    for (int c = 0; c < 16; ++c) e2m1[c] = DecodeE2m1(static_cast<uint8_t>(c));
  }
  // The FP8 table of the cache's variant (Q is converted to it on input).
  const float* fp8(const PageLayout& l) const {
    return l.fp8 == Fp8Variant::kE4m3fnuz ? e4m3fnuz : e4m3;
  }
};
const DecodeTables& Tables() {
  static const DecodeTables tables;
  return tables;
}

// Per-thread scratch of one task.
struct Scratch {
  std::vector<float> q;   // [kTaskRows, H, D] decoded queries
  std::vector<float> kt;  // [D, kBlock] decoded K block, transposed
  std::vector<float> block_scale;  // [D / 32] MXFP4 scales of one entry
  float kscale[kBlock];
  float out[kBlock];
};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define INDEXER_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
// Never inlined, so the dense walk and the gathered consumer run the very
// same instructions and get bit-identical logits.
#define INDEXER_CPU_CLONES __attribute__((noinline))
#endif

// Eight fp32 lanes (GCC / Clang vector extension): one AVX register in the
// x86-64-v3 clone, two SSE registers in the default one.
typedef float V8 __attribute__((vector_size(32)));
constexpr int kVecs = kBlock / 8;

inline V8 LoadV8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline V8 Relu(V8 v) {
  const V8 zero = {};
  return v > zero ? v : zero;
}

// out[j] = sum_h w[h] * ReLU(q[h, :] . kt[:, j]) for j < kBlock.
// q: [H, D] fp32, w: [H], kt: [D, kBlock] fp32.
// Accumulators are named vector values so that they stay in registers.
INDEXER_CPU_CLONES
void BlockLogits(const float* q, const float* w, int32_t heads, int32_t dim,
                 const float* kt, float* out) {
  V8 sum[kVecs] = {};
  int32_t h = 0;
  // Two heads at a time: each K vector load feeds two multiply-adds.
  for (; h + 1 < heads; h += 2) {
    V8 acc0[kVecs] = {}, acc1[kVecs] = {};
    const float* q0 = q + static_cast<int64_t>(h) * dim;
    const float* q1 = q0 + dim;
    for (int32_t d = 0; d < dim; ++d) {
      const float* k = kt + static_cast<int64_t>(d) * kBlock;
      const float a = q0[d], b = q1[d];
      for (int v = 0; v < kVecs; ++v) {
        const V8 kv = LoadV8(k + 8 * v);
        acc0[v] += a * kv;
        acc1[v] += b * kv;
      }
    }
    for (int v = 0; v < kVecs; ++v) {
      sum[v] += w[h] * Relu(acc0[v]) + w[h + 1] * Relu(acc1[v]);
    }
  }
  for (; h < heads; ++h) {
    V8 acc[kVecs] = {};
    const float* q0 = q + static_cast<int64_t>(h) * dim;
    for (int32_t d = 0; d < dim; ++d) {
      const float* k = kt + static_cast<int64_t>(d) * kBlock;
      for (int v = 0; v < kVecs; ++v) acc[v] += q0[d] * LoadV8(k + 8 * v);
    }
    for (int v = 0; v < kVecs; ++v) sum[v] += w[h] * Relu(acc[v]);
  }
  std::memcpy(out, sum, sizeof sum);
}

// Decodes the queries of rows [r0, r1) into q: [r1 - r0, H, D] fp32.
void DecodeQ(const PageLayout& layout, const QInput& qin, int32_t r0,
             int32_t r1, float* q) {
  const DecodeTables& t = Tables();
  const int32_t dim = layout.head_dim, heads = qin.num_heads;
  const int64_t n = static_cast<int64_t>(r1 - r0) * heads;
  if (layout.format == KvFormat::kFp8) {
    const uint8_t* v = qin.values + static_cast<int64_t>(r0) * heads * dim;
    const float* fp8 = t.fp8(layout);
    for (int64_t i = 0; i < n * dim; ++i) q[i] = fp8[v[i]];
    return;
  }
  const int32_t vb = dim / 2, sb = dim / kMxBlock;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t rh = static_cast<int64_t>(r0) * heads + i;
    const uint8_t* v = qin.values + rh * vb;
    const uint8_t* s = qin.scales + rh * sb;
    float* qo = q + i * dim;
    for (int32_t b = 0; b < vb; ++b) {
      const float sc = Pow2(static_cast<int32_t>(s[b / (kMxBlock / 2)]) - 127);
      qo[2 * b] = t.e2m1[v[b] & 0xf] * sc;
      qo[2 * b + 1] = t.e2m1[v[b] >> 4] * sc;
    }
  }
}

// Decodes entry `e` of sequence `seq` into column j of kt and, for FP8,
// its scale into kscale[j]. block_scale: [D / 32] scratch.
inline void DecodeKEntry(const PageLayout& layout, const uint8_t* pool,
                         const StepRows& rows, int32_t seq, int32_t e,
                         int32_t j, float* kt, float* kscale,
                         float* block_scale) {
  const DecodeTables& t = Tables();
  const int32_t dim = layout.head_dim, vb = layout.value_bytes();
  const int32_t chunk = layout.tiled() ? layout.d_per_tile : vb;
  const int32_t per_page = layout.page_entries;
  const uint8_t* page = pool + layout.PageOffset(rows.Page(seq, e / per_page));
  const int32_t slot = e % per_page;
  if (layout.format == KvFormat::kFp8) {
    const float* fp8 = t.fp8(layout);
    for (int32_t c = 0; c < vb; c += chunk) {
      const uint8_t* src = page + layout.ValueOffset(slot, c);
      for (int32_t b = 0; b < chunk; ++b) {
        kt[static_cast<int64_t>(c + b) * kBlock + j] = fp8[src[b]];
      }
    }
    std::memcpy(&kscale[j], page + layout.ScaleOffset(slot, 0), sizeof(float));
    return;
  }
  for (int32_t s = 0; s < dim / kMxBlock; ++s) {
    block_scale[s] =
        Pow2(static_cast<int32_t>(page[layout.ScaleOffset(slot, s)]) - 127);
  }
  for (int32_t c = 0; c < vb; c += chunk) {
    const uint8_t* src = page + layout.ValueOffset(slot, c);
    for (int32_t b = 0; b < chunk; ++b) {
      const int32_t byte = c + b;
      const float sc = block_scale[byte / (kMxBlock / 2)];
      kt[static_cast<int64_t>(2 * byte) * kBlock + j] =
          t.e2m1[src[b] & 0xf] * sc;
      kt[static_cast<int64_t>(2 * byte + 1) * kBlock + j] =
          t.e2m1[src[b] >> 4] * sc;
    }
  }
  kscale[j] = 1.0f;
}

// Zeroes columns [n, kBlock) of kt: [D, kBlock].
void ZeroTail(int32_t dim, int32_t n, float* kt) {
  if (n >= kBlock) return;
  for (int32_t d = 0; d < dim; ++d) {
    std::fill(kt + static_cast<int64_t>(d) * kBlock + n,
              kt + static_cast<int64_t>(d + 1) * kBlock, 0.0f);
  }
}

}  // namespace

void DecodeKRun(const PageLayout& layout, const uint8_t* pool,
                const StepRows& rows, int32_t seq, int32_t e0, int32_t n,
                float* kt, float* kscale, float* block_scale) {
  ZeroTail(layout.head_dim, n, kt);
  for (int32_t j = 0; j < n; ++j) {
    DecodeKEntry(layout, pool, rows, seq, e0 + j, j, kt, kscale, block_scale);
  }
}

void DecodeKList(const PageLayout& layout, const uint8_t* pool,
                 const StepRows& rows, int32_t seq, const int32_t* entries,
                 int32_t n, float* kt, float* kscale, float* block_scale) {
  ZeroTail(layout.head_dim, n, kt);
  for (int32_t j = 0; j < n; ++j) {
    DecodeKEntry(layout, pool, rows, seq, entries[j], j, kt, kscale,
                 block_scale);
  }
}

std::vector<LogitsTask> PlanLogitsTasks(const StepRows& rows,
                                        int32_t row_begin, int32_t row_end) {
  std::vector<LogitsTask> tasks;
  int32_t r = row_begin;
  while (r < row_end) {
    const int32_t seq = rows.row_seq[r];
    const int32_t seq_end =
        std::min(row_end, rows.seq_row_begin[static_cast<size_t>(seq) + 1]);
    for (int32_t r0 = r; r0 < seq_end; r0 += kTaskRows) {
      const int32_t r1 = std::min(seq_end, r0 + kTaskRows);
      int32_t visible = 0;
      for (int32_t i = r0; i < r1; ++i) {
        visible = std::max(visible, rows.row_visible[i]);
      }
      for (int32_t e = 0; e < visible; e += kTaskEntries) {
        tasks.push_back({seq, r0, r1, e, std::min(visible, e + kTaskEntries)});
      }
    }
    r = seq_end;
  }
  return tasks;
}

void RunLogitsTask(const LogitsParams& p, const LogitsTask& task) {
  thread_local Scratch scratch;
  const PageLayout& layout = *p.layout;
  const int32_t dim = layout.head_dim, heads = p.q->num_heads;
  const int32_t nrows = task.row_end - task.row_begin;
  scratch.q.resize(static_cast<size_t>(nrows) * heads * dim);
  scratch.kt.resize(static_cast<size_t>(dim) * kBlock);
  scratch.block_scale.resize(static_cast<size_t>(dim) / kMxBlock);
  DecodeQ(layout, *p.q, task.row_begin, task.row_end, scratch.q.data());

  for (int32_t e0 = task.e_begin; e0 < task.e_end; e0 += kBlock) {
    const int32_t n = std::min(kBlock, task.e_end - e0);
    DecodeKRun(layout, p.pool, *p.rows, task.seq, e0, n, scratch.kt.data(),
               scratch.kscale, scratch.block_scale.data());
    for (int32_t i = 0; i < nrows; ++i) {
      const int32_t r = task.row_begin + i;
      const int32_t count = std::min(n, p.rows->row_visible[r] - e0);
      if (count <= 0) continue;
      BlockLogits(scratch.q.data() + static_cast<int64_t>(i) * heads * dim,
                  p.q->weights + static_cast<int64_t>(r) * heads, heads, dim,
                  scratch.kt.data(), scratch.out);
      float* dst = p.logits + p.row_offset[r - p.chunk_row_begin] + e0;
      for (int32_t j = 0; j < count; ++j) {
        dst[j] = scratch.out[j] * scratch.kscale[j];
      }
    }
  }
}

std::vector<GatherTask> PlanGatherTasks(const std::vector<int64_t>& row_offset,
                                        int32_t row_begin) {
  std::vector<GatherTask> tasks;
  for (size_t i = 0; i + 1 < row_offset.size(); ++i) {
    const int64_t slots = row_offset[i + 1] - row_offset[i];
    for (int64_t j = 0; j < slots; j += kTaskEntries) {
      tasks.push_back({row_begin + static_cast<int32_t>(i),
                       static_cast<int32_t>(j),
                       static_cast<int32_t>(std::min<int64_t>(
                           slots, j + kTaskEntries))});
    }
  }
  return tasks;
}

void RunGatherTask(const GatherParams& p, const GatherTask& task) {
  thread_local Scratch scratch;
  const PageLayout& layout = *p.layout;
  const int32_t dim = layout.head_dim, heads = p.q->num_heads;
  const int32_t r = task.row, seq = p.rows->row_seq[r];
  const int32_t bs = p.cands->block_size;
  const int32_t* blocks = p.cands->row_blocks(r);
  scratch.q.resize(static_cast<size_t>(heads) * dim);
  scratch.kt.resize(static_cast<size_t>(dim) * kBlock);
  scratch.block_scale.resize(static_cast<size_t>(dim) / kMxBlock);
  DecodeQ(layout, *p.q, r, r + 1, scratch.q.data());
  float* dst = p.logits + p.row_offset[r - p.chunk_row_begin];
  int32_t entries[kBlock];
  // Same decode, kernel and scaling as RunLogitsTask, on the pool's entries.
  for (int32_t j0 = task.slot_begin; j0 < task.slot_end; j0 += kBlock) {
    const int32_t n = std::min(kBlock, task.slot_end - j0);
    for (int32_t j = 0; j < n; ++j) {
      entries[j] = blocks[(j0 + j) / bs] * bs + (j0 + j) % bs;
    }
    DecodeKList(layout, p.pool, *p.rows, seq, entries, n, scratch.kt.data(),
                scratch.kscale, scratch.block_scale.data());
    BlockLogits(scratch.q.data(),
                p.q->weights + static_cast<int64_t>(r) * heads, heads, dim,
                scratch.kt.data(), scratch.out);
    for (int32_t j = 0; j < n; ++j) {
      dst[j0 + j] = scratch.out[j] * scratch.kscale[j];
    }
  }
}

}  // namespace cpu_internal
}  // namespace indexer
