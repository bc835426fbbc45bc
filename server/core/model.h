// The served model: the daemon config after validation, as the core uses it
// (layer groups with their page layout, layer -> group map, limits).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/config.pb.h"
#include "kernels/backend.h"
#include "kernels/format/page_layout.h"

namespace indexer {

struct GroupSpec {
  std::string name;
  PageLayout layout;
  int32_t compress_ratio = 1;
  bool ue8m0 = true;
  int32_t num_heads = 0;
  int32_t topk = 0;
  config::LayerRole role = config::DENSE;
  std::vector<int32_t> layers;  // ascending
  int64_t pages = 0;            // per layer
  std::string layout_name;      // "linear" or "tiled(n,d,lanes)"
  BlockSpec block;              // role BLOCK only
};

enum class LayerRoleKind { kDense, kCandidateSource, kCandidateConsumer, kBlock };

const char* LayerRoleName(LayerRoleKind r);

// A candidate set: one source layer feeding consumer layers of its group.
struct CandidateSetSpec {
  int32_t source_layer = -1;
  std::vector<int32_t> consumers;  // ascending, all > source_layer
  CandidateSpec spec;              // spec.set = index of this set
};

struct LayerRole {
  LayerRoleKind kind = LayerRoleKind::kDense;
  int32_t set = -1;  // candidate roles: index into Model::candidate_sets
};

struct Model {
  config::ServerConfig config;  // with defaults filled in
  std::vector<GroupSpec> groups;
  // [num_layers] group index of each layer id; layer ids are 0..n-1.
  std::vector<int32_t> layer_group;
  std::vector<LayerRole> layer_role;  // [num_layers]
  std::vector<CandidateSetSpec> candidate_sets;

  int32_t num_layers() const { return static_cast<int32_t>(layer_group.size()); }
  int64_t logits_budget_bytes() const { return config.logits_budget_mb() << 20; }
};

// Reads a text-format ServerConfig.
absl::StatusOr<config::ServerConfig> LoadConfigFile(const std::string& path);

// Fills defaults, validates every field (errors name the field and the
// expected value) and sizes the pools: a group without `pages` gets an equal
// share of cache_mb by bytes. Layer ids must cover 0..n-1 exactly once.
absl::StatusOr<Model> BuildModel(config::ServerConfig cfg);

}  // namespace indexer
