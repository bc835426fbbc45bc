#include "server/core/model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "kernels/common/status_macros.h"
#include "server/core/config_check.h"

namespace indexer {
namespace {

absl::StatusOr<KvFormat> ParseFormat(const std::string& field,
                                     const std::string& s) {
  if (s == "fp8") return KvFormat::kFp8;
  if (s == "mxfp4") return KvFormat::kMxfp4;
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected \"fp8\" or \"mxfp4\", got \"", s, "\""));
}

}  // namespace

const char* LayerRoleName(LayerRoleKind r) {
  switch (r) {
    case LayerRoleKind::kDense: return "dense";
    case LayerRoleKind::kCandidateSource: return "candidate_source";
    case LayerRoleKind::kCandidateConsumer: return "candidate_consumer";
    case LayerRoleKind::kBlock: return "block";
  }
  return "unknown";
}

absl::StatusOr<config::ServerConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("config: cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  config::ServerConfig cfg;
  // The parser's first error names the line, column and field
  // ('Message type "indexer.config.ServerConfig" has no field named "x"').
  struct FirstError : google::protobuf::io::ErrorCollector {
    std::string text;
    void AddError(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
      if (text.empty()) text = absl::StrCat(line + 1, ":", column + 1, ": ", message);
    }
  } errors;
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(ss.str(), &cfg)) {
    return absl::InvalidArgumentError(absl::StrCat("config: ", path,
                                                   " is not a valid text-format ServerConfig",
                                                   errors.text.empty() ? "" : " (line ",
                                                   errors.text, errors.text.empty() ? "" : ")"));
  }
  return cfg;
}

absl::StatusOr<Model> BuildModel(config::ServerConfig cfg) {
  RETURN_IF_ERROR(FillAndCheckLimits(&cfg));
  if (cfg.groups_size() == 0) {
    return absl::InvalidArgumentError("groups: expected at least one layer group");
  }

  Model m;
  std::vector<int32_t> owner;
  int64_t total_layer_bytes_per_page_set = 0;  // sum over layers of page_bytes
  for (int gi = 0; gi < cfg.groups_size(); ++gi) {
    const config::LayerGroup& g = cfg.groups(gi);
    const std::string f = absl::StrCat("groups[", gi, "]");
    GroupSpec s;
    s.name = g.name().empty() ? absl::StrCat("group", gi) : g.name();
    ASSIGN_OR_RETURN(KvFormat fmt, ParseFormat(f + ".kv_format", g.kv_format()));
    const auto& t = g.tiling();
    // Unsigned fields are range-checked before they become int32 (no wrap).
    for (const auto& [name, value, hi] : std::vector<std::tuple<const char*, uint64_t, uint64_t>>{
             {".head_dim", g.head_dim(), 65536}, {".page_entries", g.page_entries(), 65536},
             {".compress_ratio", g.compress_ratio(), 1024},
             {".tiling.n_per_tile", t.n_per_tile(), 65536},
             {".tiling.d_per_tile", t.d_per_tile(), 65536},
             {".tiling.scale_lanes", t.scale_lanes(), 65536},
             {".pages", g.pages(), (uint64_t{1} << 31) - 1}}) {
      if (value > hi) {
        return absl::InvalidArgumentError(
            absl::StrCat(f, name, ": expected at most ", hi, ", got ", value));
      }
    }
    auto layout = PageLayout::Make(fmt, static_cast<int32_t>(g.head_dim()),
                                   static_cast<int32_t>(g.page_entries()),
                                   static_cast<int32_t>(t.n_per_tile()),
                                   static_cast<int32_t>(t.d_per_tile()),
                                   t.scale_lanes() == 0 ? 1 : static_cast<int32_t>(t.scale_lanes()));
    if (!layout.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ": ", layout.status().message()));
    }
    s.layout = *layout;
    if (g.fp8_variant().empty() || g.fp8_variant() == "e4m3fn") {
      s.layout.fp8 = Fp8Variant::kE4m3fn;
    } else if (g.fp8_variant() == "e4m3fnuz") {
      s.layout.fp8 = Fp8Variant::kE4m3fnuz;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".fp8_variant: expected \"e4m3fn\" or \"e4m3fnuz\", got \"", g.fp8_variant(), "\""));
    }
    if (fmt != KvFormat::kFp8 && !g.fp8_variant().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".fp8_variant: expected unset for an mxfp4 group, got \"", g.fp8_variant(), "\""));
    }
    s.layout_name = s.layout.tiled()
                        ? absl::StrCat("tiled(", t.n_per_tile(), ",", t.d_per_tile(),
                                       ",", s.layout.scale_lanes, ")")
                        : "linear";
    s.compress_ratio = g.compress_ratio() == 0 ? 1 : static_cast<int32_t>(g.compress_ratio());
    s.ue8m0 = g.has_ue8m0() ? g.ue8m0() : true;
    s.num_heads = static_cast<int32_t>(g.num_heads());
    s.topk = static_cast<int32_t>(g.topk());
    s.role = g.role();
    if (s.num_heads < 1 || s.num_heads > 256) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ".num_heads: expected 1..256, got ", g.num_heads()));
    }
    if (s.role == config::DENSE && (s.topk < 1 || s.topk > 65536)) {
      return absl::InvalidArgumentError(
          absl::StrCat(f, ".topk: expected 1..65536, got ", g.topk()));
    }
    if (s.compress_ratio > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".compress_ratio: expected 1..1024, got ", s.compress_ratio));
    }
    if (s.role != config::DENSE && s.role != config::BLOCK) {
      return absl::InvalidArgumentError(absl::StrCat(
          f, ".role: ", config::LayerRole_Name(s.role),
          " is not a group role; expected DENSE or BLOCK (candidate layers are named by "
          "a CandidateSet in `candidates`)"));
    }
    if (s.role == config::BLOCK) {
      const config::BlockPath& b = g.block();
      if (fmt != KvFormat::kMxfp4) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".kv_format: expected \"mxfp4\" for a BLOCK group, got \"", g.kv_format(), "\""));
      }
      if (s.compress_ratio != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".compress_ratio: expected 1 for a BLOCK group, got ", s.compress_ratio));
      }
      if (b.score() != "max") {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".block.score: expected \"max\" (the only block reduction served), got \"",
            b.score(), "\""));
      }
      if (b.topk_blocks() < 1 || b.topk_blocks() > 65536) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".block.topk_blocks: expected 1..65536, got ", b.topk_blocks()));
      }
      if (b.init_blocks() > 65536 || b.local_blocks() > 65536) {
        return absl::InvalidArgumentError(
            absl::StrCat(f, ".block: init_blocks and local_blocks expected <= 65536"));
      }
      if (!std::isfinite(b.scale()) || b.scale() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".block.scale: expected a finite value >= 0 (0 = D^-0.5), got ", b.scale()));
      }
      if (g.candidates_size() > 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(f, ".candidates: expected none in a BLOCK group"));
      }
      s.block.topk_blocks = static_cast<int32_t>(b.topk_blocks());
      s.block.init_blocks = static_cast<int32_t>(b.init_blocks());
      s.block.local_blocks = static_cast<int32_t>(b.local_blocks());
      s.block.scale = b.scale() > 0 ? b.scale() : 1.0f / std::sqrt(static_cast<float>(g.head_dim()));
      s.topk = s.block.topk_blocks;
    }
    for (const auto& r : g.layers()) {
      if (r.end() <= r.begin() || r.end() > 4096) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".layers: expected a range begin < end <= 4096, got [", r.begin(),
            ", ", r.end(), ")"));
      }
      for (uint32_t l = r.begin(); l < r.end(); ++l) {
        if (owner.size() <= l) owner.resize(l + 1, -1);
        if (owner[l] != -1) {
          return absl::InvalidArgumentError(absl::StrCat(
              f, ".layers: layer ", l, " is already in groups[", owner[l], "]"));
        }
        owner[l] = gi;
        s.layers.push_back(static_cast<int32_t>(l));
      }
    }
    if (s.layers.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(f, ".layers: expected at least one layer"));
    }
    std::sort(s.layers.begin(), s.layers.end());
    s.pages = static_cast<int64_t>(g.pages());
    if (s.pages == 0) {
      total_layer_bytes_per_page_set +=
          static_cast<int64_t>(s.layers.size()) * s.layout.page_bytes();
    }
    m.groups.push_back(std::move(s));
  }
  for (size_t l = 0; l < owner.size(); ++l) {
    if (owner[l] == -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "groups: layer ", l, " is in no group; expected layer ids 0..",
          owner.size() - 1, " each in exactly one group"));
    }
  }
  m.layer_group = owner;
  m.layer_role.assign(owner.size(), LayerRole{});
  for (size_t gi = 0; gi < m.groups.size(); ++gi) {
    if (m.groups[gi].role == config::BLOCK) {
      for (int32_t l : m.groups[gi].layers) m.layer_role[l].kind = LayerRoleKind::kBlock;
    }
    const config::LayerGroup& g = cfg.groups(static_cast<int>(gi));
    for (int ci = 0; ci < g.candidates_size(); ++ci) {
      const config::CandidateSet& c = g.candidates(ci);
      const std::string f = absl::StrCat("groups[", gi, "].candidates[", ci, "]");
      const int32_t set = static_cast<int32_t>(m.candidate_sets.size());
      CandidateSetSpec cs;
      cs.source_layer = static_cast<int32_t>(c.source_layer());
      cs.spec.set = set;
      cs.spec.block_size = static_cast<int32_t>(c.candidate_block_size());
      cs.spec.topk_blocks = static_cast<int32_t>(c.candidate_topk_blocks());
      cs.spec.pin_newest = c.has_pin_newest_block() ? c.pin_newest_block() : true;
      if (c.gate_ratio() > 1024) {
        return absl::InvalidArgumentError(
            absl::StrCat(f, ".gate_ratio: expected 0..1024 (0 = 1), got ", c.gate_ratio()));
      }
      cs.spec.gate_ratio = c.gate_ratio() == 0 ? 1 : static_cast<int32_t>(c.gate_ratio());
      if (cs.spec.block_size < 1 || cs.spec.block_size > (1 << 20)) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".candidate_block_size: expected 1..1048576, got ", c.candidate_block_size()));
      }
      if (cs.spec.topk_blocks < 1 || cs.spec.topk_blocks > (1 << 20)) {
        return absl::InvalidArgumentError(absl::StrCat(
            f, ".candidate_topk_blocks: expected 1..1048576, got ", c.candidate_topk_blocks()));
      }
      auto claim = [&](int32_t l, LayerRoleKind kind, const std::string& field) -> absl::Status {
        if (l < 0 || static_cast<size_t>(l) >= owner.size() ||
            owner[l] != static_cast<int32_t>(gi)) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": layer ", l, " is not in groups[", gi, "]; expected one of its layers"));
        }
        if (m.layer_role[l].kind != LayerRoleKind::kDense || m.layer_role[l].set != -1) {
          return absl::InvalidArgumentError(absl::StrCat(
              field, ": layer ", l, " already has the role ", LayerRoleName(m.layer_role[l].kind),
              " in another candidate set"));
        }
        m.layer_role[l] = {kind, set};
        return absl::OkStatus();
      };
      RETURN_IF_ERROR(claim(cs.source_layer, LayerRoleKind::kCandidateSource, f + ".source_layer"));
      for (const auto& r : c.consumers()) {
        for (uint32_t l = r.begin(); l < r.end(); ++l) {
          if (static_cast<int32_t>(l) <= cs.source_layer) {
            return absl::InvalidArgumentError(absl::StrCat(
                f, ".consumers: layer ", l, " comes before its source layer ", cs.source_layer,
                "; expected consumers after the source"));
          }
          RETURN_IF_ERROR(claim(static_cast<int32_t>(l), LayerRoleKind::kCandidateConsumer,
                                f + ".consumers"));
          cs.consumers.push_back(static_cast<int32_t>(l));
        }
      }
      std::sort(cs.consumers.begin(), cs.consumers.end());
      m.candidate_sets.push_back(std::move(cs));
    }
  }

  // Pools of groups without an explicit size share what the explicit ones
  // leave of cache_mb, with the same page count for every such layer.
  int64_t budget = static_cast<int64_t>(cfg.cache_mb()) << 20;
  for (const GroupSpec& s : m.groups) {
    if (s.pages > 0) budget -= s.pages * s.layout.page_bytes() * static_cast<int64_t>(s.layers.size());
  }
  for (GroupSpec& s : m.groups) {
    if (s.pages > 0) continue;
    s.pages = total_layer_bytes_per_page_set > 0 ? budget / total_layer_bytes_per_page_set : 0;
    if (s.pages < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cache_mb: ", cfg.cache_mb(), " MiB leaves no page for group '", s.name,
          "'; expected a larger cache"));
    }
  }
  for (const GroupSpec& s : m.groups) {
    if (s.pages > (int64_t{1} << 31) - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group '", s.name, "': ", s.pages, " pages; expected < 2^31"));
    }
  }
  m.config = std::move(cfg);
  return m;
}

}  // namespace indexer
