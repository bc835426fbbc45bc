// Small profiles built in code for the integration tests.
#pragma once

#include <string>
#include <vector>

#include "config/config.pb.h"
#include "server/core/model.h"
#include "tests/integration/shadow.h"

namespace indexer::testing {

struct GroupOpts {
  std::string format = "fp8";
  int page_entries = 16;
  int compress_ratio = 1;
  bool tiled = false;
  int num_layers = 2;
  int heads = 8;
  int topk = 16;
  int pages = 64;
};

inline config::ServerConfig MakeConfig(const std::vector<GroupOpts>& groups, int next_n = 1,
                                       int logits_budget_mb = 64) {
  config::ServerConfig cfg;
  cfg.set_profile("test");
  cfg.set_next_n(next_n);
  cfg.set_logits_budget_mb(logits_budget_mb);
  cfg.set_max_q_len(4096);
  cfg.set_max_seq_len(100000);
  cfg.set_threads(2);
  int layer = 0;
  for (size_t i = 0; i < groups.size(); ++i) {
    const GroupOpts& o = groups[i];
    config::LayerGroup* g = cfg.add_groups();
    g->set_name("g" + std::to_string(i));
    g->set_kv_format(o.format);
    g->set_head_dim(128);
    g->set_page_entries(o.page_entries);
    g->set_compress_ratio(o.compress_ratio);
    if (o.tiled) {
      g->mutable_tiling()->set_n_per_tile(o.page_entries % 16 == 0 ? 16 : 1);
      g->mutable_tiling()->set_d_per_tile(16);
      g->mutable_tiling()->set_scale_lanes(o.format == "mxfp4" ? 2 : 1);
    }
    auto* r = g->add_layers();
    r->set_begin(layer);
    r->set_end(layer + o.num_layers);
    layer += o.num_layers;
    g->set_num_heads(o.heads);
    g->set_topk(o.topk);
    g->set_pages(o.pages);
  }
  return cfg;
}

inline std::vector<TestLayer> TestLayers(const Model& m) {
  std::vector<TestLayer> out;
  for (int32_t l = 0; l < m.num_layers(); ++l) {
    const GroupSpec& g = m.groups[m.layer_group[l]];
    out.push_back({l, g.layout, g.compress_ratio, g.ue8m0, g.num_heads, g.topk});
  }
  return out;
}

}  // namespace indexer::testing
