#include "server/core/config_report.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/config_check.h"

namespace indexer {
namespace {

// "0-2" for consecutive ids, "0-2,5" otherwise (ids are ascending).
std::string LayerRanges(const std::vector<int32_t>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    absl::StrAppend(&out, out.empty() ? "" : ",", ids[i]);
    if (j > i) absl::StrAppend(&out, "-", ids[j]);
    i = j + 1;
  }
  return out;
}

std::string Mib(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }

}  // namespace

std::string DescribeGeometry(const Model& m) {
  const config::ServerConfig& c = m.config;
  std::string out = absl::StrCat("profile ", c.profile(), ": ", m.num_layers(), " layers in ",
                                 m.groups.size(), " groups, next_n ", c.next_n(), ", cache_mb ",
                                 c.cache_mb(), ", logits_budget_mb ", c.logits_budget_mb(),
                                 ", max_seq_len ", c.max_seq_len(), "\n");
  for (const GroupSpec& g : m.groups) {
    const int64_t page = g.layout.page_bytes();
    const int64_t per_layer = g.pages * page;
    const int64_t n_layers = static_cast<int64_t>(g.layers.size());
    // Tokens one layer's pool holds: each page holds E entries, each entry
    // r tokens.
    const int64_t tokens = g.pages * g.layout.page_entries * g.compress_ratio;
    absl::StrAppend(&out, "group ", g.name, ": layers ", LayerRanges(g.layers), " (", n_layers,
                    "), ", config::LayerRole_Name(g.role), ", ", KvFormatName(g.layout.format),
                    " D=", g.layout.head_dim, " E=", g.layout.page_entries,
                    " r=", g.compress_ratio, " ", g.layout_name, ", heads ", g.num_heads,
                    ", entry ", g.layout.entry_bytes(), " B, page ", page, " B, pages/layer ",
                    g.pages, " (", tokens, " tokens), bytes/layer ", per_layer, " (",
                    Mib(per_layer), "), group ", per_layer * n_layers, " (",
                    Mib(per_layer * n_layers), ")\n");
  }
  const int64_t total = PoolBytes(m);
  absl::StrAppend(&out, "total: ", total, " bytes (", Mib(total), ") of K pools\n");
  return out;
}

}  // namespace indexer
