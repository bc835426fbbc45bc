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
  // Candidate set inside the group: source = first layer, consumers = the
  // rest (when cand_topk_blocks > 0).
  int cand_block = 0;
  int cand_topk_blocks = 0;
  // Block group (MXFP4, r = 1) when block_topk > 0.
  int block_topk = 0;
  int init_blocks = 0;
  int local_blocks = 1;
  std::string fp8_variant;  // "" = the default (e4m3fn)
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
    if (!o.fp8_variant.empty()) g->set_fp8_variant(o.fp8_variant);
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
    if (o.cand_topk_blocks > 0) {
      config::CandidateSet* c = g->add_candidates();
      c->set_source_layer(layer - o.num_layers);
      c->add_consumers()->set_begin(layer - o.num_layers + 1);
      c->mutable_consumers(0)->set_end(layer);
      c->set_candidate_block_size(o.cand_block);
      c->set_candidate_topk_blocks(o.cand_topk_blocks);
    }
    if (o.block_topk > 0) {
      g->set_role(config::BLOCK);
      g->mutable_block()->set_topk_blocks(o.block_topk);
      g->mutable_block()->set_init_blocks(o.init_blocks);
      g->mutable_block()->set_local_blocks(o.local_blocks);
      g->mutable_block()->set_score("max");
    }
  }
  return cfg;
}

inline std::vector<TestLayer> TestLayers(const Model& m) {
  std::vector<TestLayer> out;
  for (int32_t l = 0; l < m.num_layers(); ++l) {
    const GroupSpec& g = m.groups[m.layer_group[l]];
    TestLayer t{l, g.layout, g.compress_ratio, g.ue8m0, g.num_heads, g.topk};
    const LayerRole role = m.layer_role[l];
    switch (role.kind) {
      case LayerRoleKind::kCandidateSource: t.role = Role::kSource; break;
      case LayerRoleKind::kCandidateConsumer: t.role = Role::kConsumer; break;
      case LayerRoleKind::kBlock: t.role = Role::kBlock; break;
      default: break;
    }
    if (role.set >= 0) {
      const CandidateSetSpec& cs = m.candidate_sets[role.set];
      t.source = cs.source_layer;
      t.cand_block = cs.spec.block_size;
      t.cand_topk_blocks = cs.spec.topk_blocks;
      t.pin_newest = cs.spec.pin_newest;
    }
    if (role.kind == LayerRoleKind::kBlock) {
      t.topk = g.block.topk_blocks;
      t.init_blocks = g.block.init_blocks;
      t.local_blocks = g.block.local_blocks;
      t.scale = g.block.scale;
    }
    out.push_back(t);
  }
  return out;
}

}  // namespace indexer::testing
