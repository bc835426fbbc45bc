#include "server/core/step_rows.h"

#include <algorithm>

namespace indexer {

StepRows BuildStepRows(const std::vector<StepRowsInput>& seqs,
                       int32_t compress_ratio, int64_t logits_budget_bytes) {
  StepRows out;
  const int32_t r = compress_ratio;
  out.compress_ratio = r;
  out.num_seqs = static_cast<int32_t>(seqs.size());
  out.seq_row_begin.push_back(0);
  out.seq_k_begin.push_back(0);
  for (const StepRowsInput& s : seqs) {
    const int64_t len = s.old_len + s.q_len;
    out.seq_old_entries.push_back(static_cast<int32_t>(EntriesFor(s.old_len, r)));
    out.seq_new_entries.push_back(static_cast<int32_t>(EntriesFor(len, r)));
    out.seq_k_begin.push_back(out.seq_k_begin.back() + out.seq_new_entries.back() -
                              out.seq_old_entries.back());
    out.seq_row_begin.push_back(out.seq_row_begin.back() + static_cast<int32_t>(s.q_len));
    for (int64_t p = s.old_len; p < len; ++p) {
      const int32_t visible = static_cast<int32_t>((p + 1) / r);
      out.row_visible.push_back(visible);
      out.row_seq.push_back(static_cast<int32_t>(out.seq_row_begin.size() - 2));
      out.max_visible = std::max(out.max_visible, visible);
    }
    const int32_t pages =
        static_cast<int32_t>(s.old_pages->size() + s.new_pages->size());
    out.max_pages = std::max(out.max_pages, pages);
  }
  out.num_rows = out.seq_row_begin.back();

  out.block_table.assign(static_cast<size_t>(out.num_seqs) * out.max_pages, -1);
  for (int32_t i = 0; i < out.num_seqs; ++i) {
    int32_t* row = out.block_table.data() + static_cast<size_t>(i) * out.max_pages;
    const auto& o = *seqs[i].old_pages;
    const auto& n = *seqs[i].new_pages;
    std::copy(o.begin(), o.end(), row);
    std::copy(n.begin(), n.end(), row + o.size());
  }

  // Greedy chunks in row order: a chunk's logits are rows x its widest row.
  int32_t begin = 0, widest = 0;
  for (int32_t row = 0; row < out.num_rows; ++row) {
    const int32_t w = std::max(widest, out.row_visible[row]);
    const int64_t bytes = static_cast<int64_t>(row - begin + 1) * w * 4;
    if (row > begin && bytes > logits_budget_bytes) {
      out.chunks.emplace_back(begin, row);
      begin = row;
      widest = out.row_visible[row];
    } else {
      widest = w;
    }
  }
  if (out.num_rows > 0) out.chunks.emplace_back(begin, out.num_rows);
  return out;
}

}  // namespace indexer
