// Shared by the libFuzzer targets (fuzz_step, fuzz_release,
// fuzz_write_entries) and the seed-corpus generator: the tiny in-code
// profile, the record framing of an input, and the engine with its baseline.
//
// An input is a sequence of records, each a 4-byte little-endian length and
// that many bytes of one wire message (a short last record takes what is
// left). Every target drives decode (protobuf) -> validate (server/rpc/
// convert) -> engine as server/rpc/service.cc does, and after EVERY input
// checks Engine::CheckInvariants, that no step is open, and that releasing
// every sequence the input could have touched brings the pools back to all
// pages free and no sequence; it then restores the baseline. Any failure is
// an abort() with the reason, which libFuzzer reports as a crash.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "config/config.pb.h"
#include "google/protobuf/stubs/logging.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/core/engine.h"
#include "server/core/model.h"
#include "server/rpc/convert.h"
#include "tests/integration/test_config.h"

namespace indexer::fuzz {

// Four layers over every path on small pools: 0 candidate source and 1 its
// consumer (fp8, linear), 2 dense MXFP4 tiled, 3 block (MXFP4). r = 1
// everywhere, so a step's rows and new entries are both sum(q_len).
inline config::ServerConfig FuzzConfig() {
  config::ServerConfig cfg = testing::MakeConfig(
      {{.format = "fp8", .page_entries = 16, .num_layers = 2, .heads = 4, .topk = 8,
        .pages = 48, .cand_block = 4, .cand_topk_blocks = 3},
       {.format = "mxfp4", .page_entries = 16, .tiled = true, .num_layers = 1, .heads = 4,
        .topk = 8, .pages = 48},
       {.format = "mxfp4", .page_entries = 16, .num_layers = 1, .heads = 2, .pages = 48,
        .block_topk = 2, .init_blocks = 1, .local_blocks = 1}},
      /*next_n=*/2, /*logits_budget_mb=*/1);
  cfg.set_max_q_len(256);
  cfg.set_max_batch(8);
  cfg.set_max_seq_len(700);
  return cfg;
}

// The pre-existing sequences every input starts from, imported from FP32 K.
struct BaselineSeq {
  bool named;
  std::string name;
  uint64_t num;
  int64_t tokens;
};
inline const std::vector<BaselineSeq>& Baseline() {
  static const std::vector<BaselineSeq> b = {{true, "base-a", 0, 40}, {false, "", 7, 17}};
  return b;
}
inline SeqName BaselineName(const BaselineSeq& s) {
  return s.named ? SeqName::Named(s.name) : SeqName::Numeric(s.num);
}

// Splits an input into records (see the file comment).
inline std::vector<std::string_view> Records(const uint8_t* data, size_t size) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (size - pos >= 4) {
    uint32_t n = 0;
    std::memcpy(&n, data + pos, 4);  // little-endian hosts only (x86-64, arm64)
    pos += 4;
    const size_t take = n < size - pos ? n : size - pos;
    out.emplace_back(reinterpret_cast<const char*>(data + pos), take);
    pos += take;
  }
  return out;
}
inline void AppendRecord(std::string* out, const std::string& msg) {
  const uint32_t n = static_cast<uint32_t>(msg.size());
  out->append(reinterpret_cast<const char*>(&n), 4);
  out->append(msg);
}

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "fuzz invariant violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// Counts printed at exit when INDEXER_FUZZ_STATS is set: run.sh replays the
// seed corpus with it and requires some to take effect (committed steps,
// imports, releases),
// so a profile or convert change that makes every seed invalid is caught.
struct Stats {
  long inputs = 0, ok = 0, errors = 0;
  long done = 0;  // committed steps, imports, releases
};

class Harness {
 public:
  static Harness& Get() {
    static Harness* h = new Harness();  // never destroyed: libFuzzer exits
    return *h;
  }
  Engine& engine() { return *engine_; }
  Stats& stats() { return stats_; }
  // A name the input may have created or extended; released after it.
  void Touch(const SeqName& n) { touched_.emplace(n.key, n); }
  void Result(const absl::Status& s) { s.ok() ? ++stats_.ok : ++stats_.errors; }
  // A step committed, an import or a release took effect.
  void Done() { ++stats_.done; }

  // After every input: the checks, then back to the baseline.
  void EndInput() {
    ++stats_.inputs;
    if (engine_->open_steps() != 0) {
      Fail("open_steps " + std::to_string(engine_->open_steps()) + " after the input");
    }
    Check("after the input");
    for (const BaselineSeq& b : Baseline()) Touch(BaselineName(b));
    for (const auto& [key, name] : touched_) {
      auto freed = engine_->Release({name});
      if (!freed.ok() && freed.status().code() != absl::StatusCode::kNotFound) {
        Fail("release " + name.display + ": " + freed.status().ToString());
      }
    }
    touched_.clear();
    if (engine_->num_sequences() != 0) {
      Fail(std::to_string(engine_->num_sequences()) + " sequences left after releasing all");
    }
    const std::vector<GroupUsage> usage = engine_->Usage();
    for (size_t g = 0; g < usage.size(); ++g) {
      if (usage[g].free_pages != usage[g].total_pages) {
        Fail("group " + std::to_string(g) + ": " + std::to_string(usage[g].free_pages) +
             " of " + std::to_string(usage[g].total_pages) + " pages free after releasing all");
      }
    }
    Check("after releasing all");
    MakeBaseline();
  }

 private:
  Harness() {
    // Protobuf logs every invalid UTF-8 string it parses; inputs are full of them.
    google::protobuf::SetLogHandler(nullptr);
    auto model = BuildModel(FuzzConfig());
    if (!model.ok()) Fail("profile: " + model.status().ToString());
    auto engine = Engine::Create(*std::move(model), std::make_unique<CpuBackend>(1));
    if (!engine.ok()) Fail("engine: " + engine.status().ToString());
    engine_ = *std::move(engine);
    MakeBaseline();
    if (std::getenv("INDEXER_FUZZ_STATS") != nullptr) {
      std::atexit([] {
        const Stats& s = Get().stats_;
        std::printf("fuzz stats: inputs %ld, operations ok %ld, rejected %ld, took effect %ld\n",
                    s.inputs, s.ok, s.errors, s.done);
        std::fflush(stdout);
      });
    }
  }
  void Check(const std::string& when) {
    absl::Status s = engine_->CheckInvariants();
    if (!s.ok()) Fail("CheckInvariants " + when + ": " + s.ToString());
  }
  void MakeBaseline() {
    const Model& m = engine_->model();
    for (const BaselineSeq& b : Baseline()) {
      const int64_t D = 128;
      std::string bytes(b.tokens * D * sizeof(float), '\0');
      for (int64_t i = 0; i < b.tokens * D; ++i) {
        const float v = static_cast<float>((i * 37 + b.tokens) % 23) / 11.0f - 1.0f;
        std::memcpy(&bytes[i * sizeof(float)], &v, sizeof(float));
      }
      TensorView k;
      k.dtype = DType::kFp32;
      k.shape = {b.tokens, D};
      k.data = bytes;
      k.present = true;
      std::vector<std::pair<int32_t, TensorView>> layers;
      for (int32_t l = 0; l < m.num_layers(); ++l) layers.emplace_back(l, k);
      auto len = engine_->Import(BaselineName(b), /*create=*/true, b.tokens, layers);
      if (!len.ok()) Fail("baseline import: " + len.status().ToString());
    }
    Check("after the baseline");
  }

  std::unique_ptr<Engine> engine_;
  absl::flat_hash_map<std::string, SeqName> touched_;
  Stats stats_;
};

}  // namespace indexer::fuzz
