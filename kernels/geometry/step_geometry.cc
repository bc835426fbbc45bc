#include "kernels/geometry/step_geometry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/common/status_macros.h"

namespace indexer {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view expected, int64_t got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", expected, ", got ", got));
}

absl::Status CheckSize(absl::string_view field, size_t size, int64_t want) {
  if (static_cast<int64_t>(size) == want) return absl::OkStatus();
  return Bad(absl::StrCat(field, " size"), absl::StrCat(want),
             static_cast<int64_t>(size));
}

// Checks that the pages holding entries [0, entries) of sequence `s` exist.
absl::Status CheckPages(const PageLayout& layout, const StepRows& rows,
                        int32_t s, int64_t first_entry, int64_t entries,
                        int64_t num_pages) {
  if (entries <= first_entry) return absl::OkStatus();
  const int64_t first = first_entry / layout.page_entries;
  const int64_t last = (entries - 1) / layout.page_entries;
  if (last >= rows.max_pages) {
    return Bad(absl::StrCat("max_pages (sequence ", s, " needs ", entries,
                            " entries)"),
               absl::StrCat("at least ", last + 1), rows.max_pages);
  }
  for (int64_t lp = first; lp <= last; ++lp) {
    const int32_t page = rows.Page(s, static_cast<int32_t>(lp));
    if (page < 0 || page >= num_pages) {
      return Bad(absl::StrCat("block_table[", s, "][", lp, "]"),
                 absl::StrCat("a page in [0, ", num_pages, ")"), page);
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<std::pair<int32_t, int32_t>> PlanChunks(const std::vector<int32_t>& row_visible,
                                                    int64_t logits_budget_bytes) {
  // Greedy in row order: a chunk's logits are rows x its widest row.
  std::vector<std::pair<int32_t, int32_t>> chunks;
  const int32_t n = static_cast<int32_t>(row_visible.size());
  int32_t begin = 0, widest = 0;
  for (int32_t row = 0; row < n; ++row) {
    const int32_t w = std::max(widest, row_visible[row]);
    const int64_t bytes = static_cast<int64_t>(row - begin + 1) * w * 4;
    if (row > begin && bytes > logits_budget_bytes) {
      chunks.emplace_back(begin, row);
      begin = row;
      widest = row_visible[row];
    } else {
      widest = w;
    }
  }
  if (n > 0) chunks.emplace_back(begin, n);
  return chunks;
}

StepRows BuildStepRows(const std::vector<StepRowsInput>& seqs, int32_t compress_ratio,
                       int64_t logits_budget_bytes) {
  StepRows out;
  const int32_t r = compress_ratio;
  out.compress_ratio = r;
  out.num_seqs = static_cast<int32_t>(seqs.size());
  out.seq_row_begin.push_back(0);
  out.seq_k_begin.push_back(0);
  for (const StepRowsInput& s : seqs) {
    const int64_t len = s.old_len + s.q_len;
    const int64_t cached = s.cached_len < 0 ? s.old_len : s.cached_len;
    out.seq_old_entries.push_back(static_cast<int32_t>(EntriesFor(cached, r)));
    out.seq_new_entries.push_back(static_cast<int32_t>(EntriesFor(len, r)));
    out.seq_k_begin.push_back(out.seq_k_begin.back() +
                              static_cast<int32_t>(NewEntriesFor(cached, len - cached, r)));
    out.seq_row_begin.push_back(out.seq_row_begin.back() + static_cast<int32_t>(s.q_len));
    for (int64_t p = s.old_len; p < len; ++p) {
      const int32_t visible = static_cast<int32_t>(VisibleEntries(p, r));
      out.row_visible.push_back(visible);
      out.row_seq.push_back(static_cast<int32_t>(out.seq_row_begin.size() - 2));
      out.max_visible = std::max(out.max_visible, visible);
    }
    const int32_t pages = static_cast<int32_t>(s.old_pages->size() + s.new_pages->size());
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
  out.chunks = PlanChunks(out.row_visible, logits_budget_bytes);
  return out;
}

StepRows BuildStepRowsFromPages(const std::vector<int64_t>& old_tokens,
                                const std::vector<int64_t>& q_lens,
                                const std::vector<std::vector<int32_t>>& pages,
                                int32_t compress_ratio, int64_t logits_budget_bytes,
                                const std::vector<int64_t>& cached_tokens) {
  const std::vector<int32_t> none;
  std::vector<StepRowsInput> in(old_tokens.size());
  for (size_t s = 0; s < in.size(); ++s) {
    in[s] = {old_tokens[s], q_lens[s], &pages[s], &none,
             cached_tokens.empty() ? -1 : cached_tokens[s]};
  }
  return BuildStepRows(in, compress_ratio, logits_budget_bytes);
}

std::vector<std::pair<int32_t, int32_t>> EvenChunks(int32_t num_rows, int32_t chunk_rows) {
  std::vector<std::pair<int32_t, int32_t>> chunks;
  for (int32_t b = 0; b < num_rows; b += chunk_rows) {
    chunks.emplace_back(b, std::min(num_rows, b + chunk_rows));
  }
  return chunks;
}

absl::Status ValidateStepRows(const PageLayout& layout, const StepRows& rows,
                              int64_t num_pages) {
  const int32_t ns = rows.num_seqs, nr = rows.num_rows;
  if (ns < 0) return Bad("num_seqs", ">= 0", ns);
  if (nr < 0) return Bad("num_rows", ">= 0", nr);
  if (rows.compress_ratio < 1) {
    return Bad("compress_ratio", ">= 1", rows.compress_ratio);
  }
  if (rows.max_pages < 0) return Bad("max_pages", ">= 0", rows.max_pages);
  RETURN_IF_ERROR(CheckSize("seq_row_begin", rows.seq_row_begin.size(), ns + 1));
  RETURN_IF_ERROR(CheckSize("seq_k_begin", rows.seq_k_begin.size(), ns + 1));
  RETURN_IF_ERROR(CheckSize("seq_old_entries", rows.seq_old_entries.size(), ns));
  RETURN_IF_ERROR(CheckSize("seq_new_entries", rows.seq_new_entries.size(), ns));
  RETURN_IF_ERROR(CheckSize("row_visible", rows.row_visible.size(), nr));
  RETURN_IF_ERROR(CheckSize("row_seq", rows.row_seq.size(), nr));
  RETURN_IF_ERROR(CheckSize("block_table", rows.block_table.size(),
                            static_cast<int64_t>(ns) * rows.max_pages));
  if (rows.seq_row_begin[0] != 0) {
    return Bad("seq_row_begin[0]", "0", rows.seq_row_begin[0]);
  }
  if (rows.seq_k_begin[0] != 0) {
    return Bad("seq_k_begin[0]", "0", rows.seq_k_begin[0]);
  }
  if (rows.seq_row_begin[ns] != nr) {
    return Bad(absl::StrCat("seq_row_begin[", ns, "]"),
               absl::StrCat(nr, " (num_rows)"), rows.seq_row_begin[ns]);
  }
  for (int32_t s = 0; s < ns; ++s) {
    const int32_t old_e = rows.seq_old_entries[s];
    const int32_t new_e = rows.seq_new_entries[s];
    if (old_e < 0 || new_e < old_e) {
      return Bad(absl::StrCat("seq_new_entries[", s, "]"),
                 absl::StrCat(">= seq_old_entries (", old_e, ") >= 0"), new_e);
    }
    if (rows.seq_row_begin[s + 1] < rows.seq_row_begin[s]) {
      return Bad(absl::StrCat("seq_row_begin[", s + 1, "]"),
                 absl::StrCat(">= ", rows.seq_row_begin[s]),
                 rows.seq_row_begin[s + 1]);
    }
    const int64_t k_count = static_cast<int64_t>(rows.seq_k_begin[s + 1]) -
                            rows.seq_k_begin[s];
    if (k_count != new_e - old_e) {
      return Bad(absl::StrCat("seq_k_begin[", s + 1, "] - seq_k_begin[", s,
                              "]"),
                 absl::StrCat(new_e - old_e, " (new - old entries)"), k_count);
    }
    RETURN_IF_ERROR(CheckPages(layout, rows, s, 0, new_e, num_pages));
    for (int32_t r = rows.seq_row_begin[s]; r < rows.seq_row_begin[s + 1];
         ++r) {
      if (rows.row_seq[r] != s) {
        return Bad(absl::StrCat("row_seq[", r, "]"), absl::StrCat(s),
                   rows.row_seq[r]);
      }
      if (rows.row_visible[r] < 0 || rows.row_visible[r] > new_e) {
        return Bad(absl::StrCat("row_visible[", r, "]"),
                   absl::StrCat("a count in [0, ", new_e,
                                "] (entries of sequence ", s, ")"),
                   rows.row_visible[r]);
      }
    }
  }
  int32_t next = 0;
  for (size_t c = 0; c < rows.chunks.size(); ++c) {
    const auto [b, e] = rows.chunks[c];
    if (b != next || e <= b || e > nr) {
      return Bad(absl::StrCat("chunks[", c, "]"),
                 absl::StrCat("rows [", next, ", end) with ", next,
                              " < end <= ", nr, "; begin is"),
                 b);
    }
    next = e;
  }
  if (!rows.chunks.empty() && next != nr) {
    return Bad("chunks", absl::StrCat("to cover all ", nr, " rows, covered"),
               next);
  }
  return absl::OkStatus();
}

}  // namespace indexer
