// Builds the per-step metadata of one layer group (SPEC §6): row lengths,
// block tables and the logits-budget chunk plan. Built once per step.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"

namespace indexer {

struct StepRowsInput {
  int64_t old_len = 0;                  // tokens before the step
  int64_t q_len = 0;                    // new tokens
  const std::vector<int32_t>* old_pages = nullptr;  // committed block table
  const std::vector<int32_t>* new_pages = nullptr;  // allocated for the step
};

// Entries held by a sequence of `len` tokens at compress ratio `r`.
inline int64_t EntriesFor(int64_t len, int32_t r) { return len / r; }
// Pages holding `entries` entries.
inline int64_t PagesFor(int64_t entries, int32_t page_entries) {
  return (entries + page_entries - 1) / page_entries;
}

StepRows BuildStepRows(const std::vector<StepRowsInput>& seqs,
                       int32_t compress_ratio, int64_t logits_budget_bytes);

}  // namespace indexer
