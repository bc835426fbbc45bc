// Engine lifecycle: listing a namespace's sequences, exporting a sequence's
// entries, the idle TTL and sticky device errors (engine.h).
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/geometry/step_geometry.h"
#include "server/core/engine.h"

namespace indexer {
namespace {

// The registry key of namespace `ns`'s sequences starts with this (SeqName:
// the namespace is length-prefixed), followed by '#' (numeric) or '$' (named).
std::string NamespacePrefix(const std::string& ns) { return absl::StrCat(ns.size(), ":", ns); }

}  // namespace

absl::Status Engine::CheckDevice() const {
  if (!device_failed()) return absl::OkStatus();
  return absl::UnavailableError(
      "device: a sticky device error stopped this daemon (it is NOT_SERVING and exiting); "
      "expected a restarted daemon");
}

absl::Status Engine::NoteDeviceStatus(absl::Status s) {
  metrics_.MaybeDeviceError(s);  // counted for /metrics (internal errors too)
  if (s.code() != absl::StatusCode::kUnavailable) return s;
  if (device_errors_.fetch_add(1) == 0 && device_error_handler_) device_error_handler_(s);
  return s;
}

absl::StatusOr<SequencePage> Engine::ListSequences(const std::string& ns,
                                                   const std::string& cursor,
                                                   size_t limit) const {
  if (!cursor.empty() && cursor[0] != '#' && cursor[0] != '$') {
    return absl::InvalidArgumentError(
        "page_token: expected \"\" or the next_page_token of an earlier ListSequences reply");
  }
  limit = std::max<size_t>(limit, 1);
  const std::string prefix = NamespacePrefix(ns);
  const Clock::time_point now = Clock::now();
  // (suffix, sequence) of the namespace past the cursor, in suffix order.
  std::vector<std::pair<std::string, SequenceListing>> found;
  absl::MutexLock lock(&mu_);
  for (const auto& [key, seq] : seqs_) {
    if (!absl::StartsWith(key, prefix) || key.size() <= prefix.size()) continue;
    std::string suffix = key.substr(prefix.size());
    if ((suffix[0] != '#' && suffix[0] != '$') || suffix <= cursor) continue;
    SequenceListing l;
    l.numeric = suffix[0] == '#';
    if (l.numeric) {
      (void)absl::SimpleAtoi(absl::string_view(suffix).substr(1), &l.num);
    } else {
      l.name = suffix.substr(1);
    }
    l.length = seq->len;
    for (const auto& pages : seq->pages) l.pages.push_back(static_cast<int64_t>(pages.size()));
    l.busy = seq->busy;
    l.idle_ms = l.busy ? 0
                       : std::chrono::duration_cast<std::chrono::milliseconds>(now - seq->last_used)
                             .count();
    found.emplace_back(std::move(suffix), std::move(l));
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  SequencePage page;
  for (auto& [suffix, l] : found) {
    if (page.sequences.size() == limit) {
      page.next_cursor = found[limit - 1].first;
      break;
    }
    page.sequences.push_back(std::move(l));
  }
  return page;
}

int64_t Engine::ReleaseIdle(Clock::time_point now) {
  const uint64_t ttl_ms = model_.config.sequence_idle_ttl_ms();
  if (ttl_ms == 0) return 0;
  const Clock::time_point before = now - std::chrono::milliseconds(ttl_ms);
  int64_t released = 0;
  absl::MutexLock lock(&mu_);
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    Sequence& seq = *it->second;
    if (seq.busy || seq.exports > 0 || seq.last_used > before) {
      ++it;
      continue;
    }
    for (size_t g = 0; g < allocators_.size(); ++g) allocators_[g].Free(seq.pages[g]);
    seqs_.erase(it++);
    ++released;
  }
  idle_released_.fetch_add(released);
  return released;
}

absl::StatusOr<std::unique_ptr<SequenceExport>> Engine::Export(const SeqName& name) {
  RETURN_IF_ERROR(CheckDevice());
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(name.key);
  if (it == seqs_.end()) {
    return absl::NotFoundError(absl::StrCat("id: unknown sequence ", name.display));
  }
  Sequence& seq = *it->second;
  if (seq.len == 0) {
    // Created by a step still open: nothing is committed yet.
    return absl::FailedPreconditionError(absl::StrCat(
        "id: sequence ", name.display, " has no committed tokens yet; expected its first step "
        "to commit"));
  }
  // Made only once the sequence is pinned: its destructor unpins.
  std::unique_ptr<SequenceExport> ex(new SequenceExport(this, name.key));
  ++seq.exports;
  seq.last_used = Clock::now();
  ex->len_ = seq.len;
  // The committed part of the block table: a step in flight may append
  // pages (under mu_), never change these.
  for (size_t g = 0; g < seq.pages.size(); ++g) {
    const GroupSpec& gs = model_.groups[g];
    const int64_t n = PagesFor(EntriesFor(seq.len, gs.compress_ratio), gs.layout.page_entries);
    ex->pages_.emplace_back(seq.pages[g].begin(), seq.pages[g].begin() + n);
  }
  return ex;
}

void Engine::EndExport(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(key);
  if (it == seqs_.end()) return;  // cannot happen: Release refuses it
  --it->second->exports;
  it->second->last_used = Clock::now();
}

SequenceExport::~SequenceExport() { engine_->EndExport(key_); }

absl::StatusOr<SequenceExport::Chunk> SequenceExport::Next(int64_t max_payload_bytes,
                                                           int64_t max_tokens,
                                                           const std::string& bytes_field) {
  const Model& m = engine_->model_;
  RETURN_IF_ERROR(engine_->CheckDevice());
  if (done()) return absl::OutOfRangeError("export: no tokens left");
  const int64_t first = next_token_;
  // Entry bytes of `n` tokens from `first` over every layer: monotone in n.
  auto payload = [&](int64_t n) {
    int64_t bytes = 0;
    for (int32_t l = 0; l < m.num_layers(); ++l) {
      const GroupSpec& g = m.groups[m.layer_group[l]];
      bytes += NewEntriesFor(first, n, g.compress_ratio) * g.layout.entry_bytes();
    }
    return bytes;
  };
  int64_t lo = 1, hi = std::min<int64_t>(std::max<int64_t>(max_tokens, 1), len_ - first);
  if (payload(1) > max_payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        bytes_field, ": one token's entries over every layer take ", payload(1),
        " bytes plus framing; expected a larger limit"));
  }
  while (lo < hi) {  // the largest n in [lo, hi] with payload(n) <= max
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (payload(mid) <= max_payload_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  Chunk c;
  c.first_token = first;
  c.num_tokens = lo;
  c.layers.resize(m.num_layers());
  Backend& b = *engine_->backend_;
  for (int32_t l = 0; l < m.num_layers(); ++l) {
    const int32_t gi = m.layer_group[l];
    const GroupSpec& g = m.groups[gi];
    const int64_t e0 = EntriesFor(first, g.compress_ratio);
    const int64_t e1 = EntriesFor(first + c.num_tokens, g.compress_ratio);
    const int64_t eb = g.layout.entry_bytes();
    const int64_t E = g.layout.page_entries;
    std::string& out = c.layers[l];
    out.resize(static_cast<size_t>((e1 - e0) * eb));
    for (int64_t e = e0; e < e1;) {
      const int64_t in_page = e % E;
      const int64_t count = std::min(E - in_page, e1 - e);
      absl::Status s = b.ReadEntries(g.layout, engine_->pools_[l], pages_[gi][e / E],
                                     static_cast<int32_t>(in_page), static_cast<int32_t>(count),
                                     reinterpret_cast<uint8_t*>(out.data()) + (e - e0) * eb);
      if (!s.ok()) {
        return engine_->NoteDeviceStatus(
            absl::Status(s.code(), absl::StrCat("export: layer ", l, ": ", s.message())));
      }
      e += count;
    }
  }
  next_token_ = first + c.num_tokens;
  return c;
}

}  // namespace indexer
