// Step geometry, the one owner of it (SPEC §2, §4, §5, §6): tokens ->
// entries under a compress ratio, the new entries of a step, each row's
// visible entries, pages needed, the block table, the prefill chunk plan
// under the logits budget, and a candidate pool's entries and slots. Used by
// the server core, both backends, the client's reference, the tests and the
// bench; nothing else computes these.
// No gRPC and no server types here.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "kernels/format/hd.h"
#include "kernels/format/page_layout.h"

namespace indexer {

// Entries held by a sequence of `tokens` tokens at compress ratio `r`.
inline int64_t EntriesFor(int64_t tokens, int32_t r) { return tokens / r; }
// New entries of a step taking a sequence from `old_tokens` to
// `old_tokens + q_len` tokens: (L0 + q_len) // r - L0 // r (may be 0).
inline int64_t NewEntriesFor(int64_t old_tokens, int64_t q_len, int32_t r) {
  return EntriesFor(old_tokens + q_len, r) - EntriesFor(old_tokens, r);
}
// Entries visible to the row at token position `position`: (p + 1) // r.
inline int64_t VisibleEntries(int64_t position, int32_t r) { return (position + 1) / r; }
// Pages holding `entries` entries.
inline int64_t PagesFor(int64_t entries, int32_t page_entries) {
  return (entries + page_entries - 1) / page_entries;
}
// Logical page (index into a sequence's block-table row) of entry `pos`,
// and the entry's slot inside that page. Host and device code.
INDEXER_HD int32_t LogicalPage(int32_t pos, int32_t page_entries) {
  return pos / page_entries;
}
INDEXER_HD int32_t SlotInPage(int32_t pos, int32_t page_entries) {
  return pos - LogicalPage(pos, page_entries) * page_entries;
}
// Candidate pools (SPEC §5): a row's pool is its chosen blocks of `block`
// entries, ascending block ids. Only the row's newest block (the one holding
// entry n - 1 of its n visible entries) can be partial.
// Entries below n that a pool of `count` blocks holds; `has_newest`:
// whether the newest block is among them.
INDEXER_HD int32_t PoolEntries(int32_t n, int32_t block, int32_t count, bool has_newest) {
  const int32_t newest = (n + block - 1) / block - 1;
  return has_newest ? (count - 1) * block + (n - newest * block) : count * block;
}
// The entry that slot j of a pool holds (`blocks`: its ascending block ids):
// slots number the pool's entries in position order.
INDEXER_HD int32_t PoolSlotEntry(const int32_t* blocks, int32_t block, int32_t j) {
  return blocks[j / block] * block + j % block;
}
// Pages a sequence of `tokens` tokens needs at ratio `r`.
inline int64_t PagesForTokens(int64_t tokens, int32_t r, int32_t page_entries) {
  return PagesFor(EntriesFor(tokens, r), page_entries);
}

// The batch of one step as one layer group sees it (SPEC §2). Built once per
// step by BuildStepRows and shared, read-only, by every layer of the group.
// Rows are the sequences' new tokens in batch order: sequence s owns rows
// [seq_row_begin[s], seq_row_begin[s+1]).
struct StepRows {
  int32_t num_seqs = 0;
  int32_t num_rows = 0;
  int32_t compress_ratio = 1;
  // [num_seqs + 1] prefix sum of q_len.
  std::vector<int32_t> seq_row_begin;
  // [num_seqs] entries held before the step and after it. A sequence's new
  // entries are [seq_old_entries[s], seq_new_entries[s]).
  std::vector<int32_t> seq_old_entries;
  std::vector<int32_t> seq_new_entries;
  // [num_seqs + 1] first row of each sequence's new entries in a layer's K
  // tensor (prefix sum of new - old).
  std::vector<int32_t> seq_k_begin;
  // [num_rows] visible entries n_r of each row; [num_rows] its sequence.
  std::vector<int32_t> row_visible;
  std::vector<int32_t> row_seq;
  int32_t max_visible = 0;
  // [num_seqs, max_pages] physical page of each logical page after the step
  // (old pages, then the pages allocated for it); -1 past the sequence's end.
  int32_t max_pages = 0;
  std::vector<int32_t> block_table;
  // Row chunks [begin, end) in order, covering all rows, each with
  // rows x max(row_visible) x 4 bytes of logits under the logits budget
  // (a single row may exceed it). Empty = one chunk of all rows.
  std::vector<std::pair<int32_t, int32_t>> chunks;

  int32_t NewEntries() const { return seq_k_begin.empty() ? 0 : seq_k_begin.back(); }
  // Physical page of logical page `lp` of sequence `s`.
  int32_t Page(int32_t s, int32_t lp) const {
    return block_table[static_cast<size_t>(s) * max_pages + lp];
  }
  // The chunk plan with the empty plan spelled out.
  std::vector<std::pair<int32_t, int32_t>> Chunks() const {
    if (!chunks.empty() || num_rows == 0) return chunks;
    return {{0, num_rows}};
  }
};

// One sequence of a step: tokens before it, new tokens (its rows), and its
// pages after the step: `old_pages` (committed) then `new_pages` (taken for
// the step). The caller keeps the vectors alive during BuildStepRows.
struct StepRowsInput {
  int64_t old_len = 0;
  int64_t q_len = 0;
  const std::vector<int32_t>* old_pages = nullptr;
  const std::vector<int32_t>* new_pages = nullptr;
  // Tokens whose entries are already in the cache; the step writes the
  // entries after them. -1 = old_len (every real step). Tests that fill a
  // cache in one step and query only its last rows set 0.
  int64_t cached_len = -1;
};

// The greedy chunk plan over rows of these visible counts: chunks in row
// order, covering every row, each with rows x widest x 4 <= budget bytes
// unless it is a single row.
std::vector<std::pair<int32_t, int32_t>> PlanChunks(const std::vector<int32_t>& row_visible,
                                                    int64_t logits_budget_bytes);

StepRows BuildStepRows(const std::vector<StepRowsInput>& seqs, int32_t compress_ratio,
                       int64_t logits_budget_bytes);

// A step for tests and the bench: sequence s goes from old_tokens[s] to
// old_tokens[s] + q_lens[s] tokens; `pages[s]` is its whole block table
// after the step (at least PagesForTokens of the new length). With
// `cached_tokens` (one per sequence) the step writes the entries after
// cached_tokens[s] instead of after old_tokens[s].
StepRows BuildStepRowsFromPages(const std::vector<int64_t>& old_tokens,
                                const std::vector<int64_t>& q_lens,
                                const std::vector<std::vector<int32_t>>& pages,
                                int32_t compress_ratio, int64_t logits_budget_bytes,
                                const std::vector<int64_t>& cached_tokens = {});

// Chunks of `chunk_rows` rows (the last may be shorter) over `num_rows`
// rows; tests and the bench force sub-chunking with it.
std::vector<std::pair<int32_t, int32_t>> EvenChunks(int32_t num_rows, int32_t chunk_rows);

// INVALID_ARGUMENT naming the field unless `rows` is consistent: sizes,
// prefix sums, rows of each sequence, visible counts within the sequence's
// entries, every page holding a sequence's entries in [0, num_pages), chunks
// covering the rows in order. The backends' one set of rules.
absl::Status ValidateStepRows(const PageLayout& layout, const StepRows& rows, int64_t num_pages);

}  // namespace indexer
