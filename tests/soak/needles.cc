#include "tests/soak/needles.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "indexer/client.h"

namespace indexer::soak {

using client::LayerSpec;

const std::vector<float>& NeedleField::Direction(int32_t d) {
  std::vector<float>& u = directions_[d];
  if (u.empty()) {
    u.resize(d);
    for (float& x : u) x = (rng_.Next() & 1 ? 1.0f : -1.0f) / std::sqrt(static_cast<float>(d));
  }
  return u;
}

v1::Tensor NeedleField::Queries(const LayerSpec& spec, int64_t rows) {
  const std::vector<float>& u = Direction(spec.head_dim);
  std::vector<float> q;
  q.reserve(rows * spec.num_heads * spec.head_dim);
  for (int64_t i = 0; i < rows * spec.num_heads; ++i) q.insert(q.end(), u.begin(), u.end());
  return client::MakeFp32Tensor(q, {rows, spec.num_heads, spec.head_dim});
}

std::vector<uint8_t> NeedleField::Entries(const LayerSpec& spec, int64_t first, int64_t n,
                                          absl::Span<const int64_t> needles, uint64_t salt) {
  const int64_t eb = spec.entry_bytes();
  std::vector<uint8_t>& noise = noise_[spec.layer];
  if (noise.empty()) {
    std::vector<float> k(kNoiseEntries * spec.head_dim);
    rng_.FillNormal(absl::MakeSpan(k));
    noise = client::QuantizeKEntries(spec, k);
  }
  std::vector<uint8_t>& needle = needle_[spec.layer];
  if (needle.empty()) {
    std::vector<float> k = Direction(spec.head_dim);
    for (float& x : k) x *= kNeedleNorm;
    needle = client::QuantizeKEntries(spec, k);
  }
  std::vector<uint8_t> out(n * eb);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t e = first + i;
    const bool is_needle = std::any_of(needles.begin(), needles.end(), [&](int64_t t) {
      return t / spec.compress_ratio == e;
    });
    const uint8_t* src =
        is_needle ? needle.data()
                  : noise.data() +
                        static_cast<int64_t>((static_cast<uint64_t>(e) * 2654435761u + salt) %
                                             kNoiseEntries) *
                            eb;
    std::copy(src, src + eb, out.data() + i * eb);
  }
  return out;
}

int NeedlesPerSeq(const std::vector<LayerSpec>& specs) {
  int n = 3;
  for (const LayerSpec& spec : specs) {
    int free = spec.topk;
    if (spec.is_block()) free = spec.topk_blocks - spec.init_blocks - spec.local_blocks;
    if (spec.is_source() || spec.is_consumer()) {
      free = std::min(free, spec.candidate_topk_blocks - (spec.pin_newest_block ? 1 : 0));
    }
    n = std::min(n, std::max(free, 0));
  }
  return n;
}

std::vector<int64_t> PlaceNeedles(client::Rng& rng, int64_t len, int count) {
  const auto between = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(hi - lo + 1));
  };
  std::vector<int64_t> t = {between(0, len / 8 - 1), between(len / 3, 2 * len / 3 - 1),
                            between(len - len / 8, len - 1)};
  t.resize(std::clamp(count, 0, 3));
  return t;
}

absl::Status CheckNeedles(const LayerSpec& spec, absl::Span<const int64_t> bounds,
                          absl::Span<const int64_t> q_lens,
                          const std::vector<std::vector<int64_t>>& needles,
                          const std::vector<std::string>& names, absl::Span<const int32_t> topk,
                          int64_t* found) {
  const int64_t rows = static_cast<int64_t>(bounds.size());
  const int64_t k = spec.is_block() ? spec.topk_blocks : spec.topk;
  const int heads = spec.is_block() ? spec.num_heads : 1;
  if (static_cast<int64_t>(topk.size()) != heads * rows * k) {
    return absl::InternalError(absl::StrCat("layer ", spec.layer, ": ", topk.size(),
                                            " indices, expected ", heads * rows * k));
  }
  int64_t row = 0;
  for (size_t i = 0; i < q_lens.size(); ++i) {
    for (int64_t j = 0; j < q_lens[i]; ++j, ++row) {
      for (int64_t t : needles[i]) {
        const int64_t entry = t / spec.compress_ratio;
        const int64_t id = spec.is_block() ? entry / spec.page_entries : entry;
        if (id >= bounds[row]) continue;
        for (int h = 0; h < heads; ++h) {
          const int32_t* r = topk.data() + (h * rows + row) * k;
          if (std::find(r, r + k, static_cast<int32_t>(id)) == r + k) {
            return absl::InternalError(absl::StrCat(
                "layer ", spec.layer, " (", spec.role, "), row ", row, " (", names[i],
                heads > 1 ? absl::StrCat(", head ", h) : "",
                "): the needle at token ", t,
                spec.is_block() ? absl::StrCat(" (block ", id, ")") : absl::StrCat(" (entry ", id, ")"),
                " is not in its top-", k, " of ", bounds[row]));
          }
          ++*found;
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace indexer::soak
