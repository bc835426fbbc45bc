// The core on the cpu backend, without gRPC: steps, atomic commit and
// rollback, every bad-input case of the step and the allocator invariant
// under seeded random operation sequences.
#include "server/core/engine.h"

#include <functional>
#include <map>
#include <set>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/integration/test_config.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;

TensorView View(DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes) {
  TensorView v;
  v.present = true;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.data = absl::string_view(static_cast<const char*>(data), bytes);
  return v;
}

class EngineTest : public ::testing::Test {
 protected:
  void Init(const config::ServerConfig& cfg) {
    auto model = BuildModel(cfg);
    ASSERT_TRUE(model.ok()) << model.status();
    layers_ = TestLayers(*model);
    auto engine = Engine::Create(*std::move(model), std::make_unique<CpuBackend>(2));
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    shadow_ = std::make_unique<Shadow>(layers_, 1234);
  }
  void SetUp() override { Init(MakeConfig({{.format = "fp8"}, {.format = "mxfp4", .compress_ratio = 4, .tiled = true}})); }

  StepSpec Spec(const std::vector<SeqStep>& seqs) {
    StepSpec spec;
    for (const auto& [s, q] : seqs) {
      spec.seqs.push_back({SeqName::Named(s), q, shadow_->len(s) == 0 && !known_.count(s)});
    }
    return spec;
  }

  // Float K and Q for even layers, pre-quantized / native for odd ones.
  LayerInput Input(size_t li, const LayerData& d) {
    const TestLayer& t = layers_[li];
    const PageLayout& L = t.layout;
    const int64_t D = L.head_dim, H = t.num_heads;
    LayerInput in;
    in.layer = t.layer;
    if (t.role == Role::kBlock) {
      in.k = View(DType::kUint8, {d.n_new, L.entry_bytes()}, d.k_quant.data(), d.k_quant.size());
      in.q = View(DType::kFp32, {d.rows, H, D}, d.q_float.data(), d.q_float.size() * 4);
      return in;
    }
    if (li % 2 == 0) {
      in.k = View(DType::kFp32, {d.n_new, D}, d.k_float.data(), d.k_float.size() * 4);
      in.q = View(DType::kFp32, {d.rows, H, D}, d.q_float.data(), d.q_float.size() * 4);
      in.weights = View(DType::kFp32, {d.rows, H}, d.weights.data(), d.weights.size() * 4);
    } else {
      in.k = View(DType::kUint8, {d.n_new, L.entry_bytes()}, d.k_quant.data(), d.k_quant.size());
      if (L.format == KvFormat::kFp8) {
        in.q = View(DType::kFp8E4m3, {d.rows, H, D}, d.q_codes.data(), d.q_codes.size());
      } else {
        in.q = View(DType::kUint8, {d.rows, H, D / 2}, d.q_codes.data(), d.q_codes.size());
        in.q_scale = View(DType::kUint8, {d.rows, H, D / 32}, d.q_scales.data(), d.q_scales.size());
      }
      in.weights = View(DType::kFp32, {d.rows, H}, d.w_folded.data(), d.w_folded.size() * 4);
    }
    return in;
  }

  // Runs a full step through every layer, checking each top-k, and commits.
  void RunStep(const std::vector<SeqStep>& seqs) {
    auto step = engine_->BeginStep(Spec(seqs));
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<LayerData> data = shadow_->Make(seqs);
    for (size_t li = 0; li < layers_.size(); ++li) {
      auto out = (*step)->RunLayer(Input(li, data[li]));
      ASSERT_TRUE(out.ok()) << out.status();
      const std::vector<int64_t> want =
          layers_[li].role == Role::kBlock
              ? std::vector<int64_t>{layers_[li].num_heads, data[li].rows, layers_[li].topk}
              : std::vector<int64_t>{data[li].rows, layers_[li].topk};
      ASSERT_EQ(out->shape, want);
      shadow_->Check(li, seqs, data[li], out->indices.data());
    }
    auto lens = (*step)->Commit();
    ASSERT_TRUE(lens.ok()) << lens.status();
    shadow_->Commit(seqs, data);
    for (size_t i = 0; i < seqs.size(); ++i) {
      EXPECT_EQ((*lens)[i], shadow_->len(seqs[i].first));
      known_.insert(seqs[i].first);
    }
    ASSERT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
  }

  // Everything a failed call must leave alone: lengths, block tables, the
  // committed entries of every layer, free pages.
  std::string Digest() {
    std::string out;
    for (const GroupUsage& u : engine_->Usage()) out += std::to_string(u.free_pages) + ";";
    for (const std::string& s : known_) {
      auto len = engine_->SequenceLength(SeqName::Named(s));
      out += s + ":" + (len.ok() ? std::to_string(*len) : "gone") + ";";
      if (!len.ok()) continue;
      for (const TestLayer& t : layers_) {
        const int32_t g = engine_->model().layer_group[t.layer];
        auto pages = engine_->SequencePages(SeqName::Named(s), g);
        const int64_t n = EntriesFor(*len, t.compress_ratio);
        std::vector<uint8_t> buf(t.layout.entry_bytes());
        for (int64_t e = 0; e < n; ++e) {
          const int32_t page = (*pages)[e / t.layout.page_entries];
          EXPECT_TRUE(engine_->backend()
                          .ReadEntries(t.layout, engine_->pool(t.layer), page,
                                       e % t.layout.page_entries, 1, buf.data())
                          .ok());
          out.append(buf.begin(), buf.end());
        }
      }
    }
    return out;
  }

  // Expects `s` to fail with `code`, its message naming `field`, and the
  // cache exactly as `before`.
  void ExpectRejected(const absl::Status& s, absl::StatusCode code, const std::string& field,
                      const std::string& before) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
    EXPECT_EQ(Digest(), before) << "cache changed by a failed call: " << s;
    EXPECT_TRUE(engine_->CheckInvariants().ok()) << engine_->CheckInvariants();
    EXPECT_EQ(engine_->open_steps(), 0);
  }

  std::vector<TestLayer> layers_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Shadow> shadow_;
  std::set<std::string> known_;
};

TEST_F(EngineTest, PrefillThenDecodeMatchesReference) {
  RunStep({{"a", 37}, {"b", 5}});
  RunStep({{"a", 1}, {"b", 1}});
  RunStep({{"b", 2}, {"a", 1}, {"c", 9}});  // mixed: decode, prefill chunk, new
}

// A layer's failure after other layers wrote their entries leaves nothing.
TEST_F(EngineTest, FailedLayerMidStepRollsBack) {
  RunStep({{"a", 20}});
  const std::string before = Digest();
  auto step = engine_->BeginStep(Spec({{"a", 30}}));
  ASSERT_TRUE(step.ok());
  std::vector<LayerData> data = shadow_->Make({{"a", 30}});
  ASSERT_TRUE((*step)->RunLayer(Input(0, data[0])).ok());
  LayerInput bad = Input(1, data[1]);
  bad.weights.shape = {1};
  auto out = (*step)->RunLayer(bad);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  step->reset();
  ExpectRejected(out.status(), absl::StatusCode::kInvalidArgument, "weights", before);
}

struct BadCase {
  std::string name;
  absl::StatusCode code;
  std::string field;
};

TEST_F(EngineTest, BadLayerInputs) {
  RunStep({{"a", 40}, {"b", 3}});
  const std::string before = Digest();
  const std::vector<SeqStep> seqs = {{"a", 2}, {"b", 1}};
  std::vector<LayerData> data = shadow_->Make(seqs);
  std::vector<std::pair<BadCase, std::function<void(LayerInput&)>>> cases = {
      {{"wrong q dtype", absl::StatusCode::kInvalidArgument, "q: expected"},
       [](LayerInput& in) { in.q.dtype = DType::kInt32; }},
      {{"q shape", absl::StatusCode::kInvalidArgument, "q: expected"},
       [](LayerInput& in) { in.q.shape[2] -= 1; }},
      {{"q bytes", absl::StatusCode::kInvalidArgument, "bytes"},
       [](LayerInput& in) { in.q.data.remove_suffix(4); }},
      {{"k rows", absl::StatusCode::kInvalidArgument, "k: expected"},
       [](LayerInput& in) { in.k.shape[0] += 1; }},
      {{"k dtype", absl::StatusCode::kInvalidArgument, "k: expected"},
       [](LayerInput& in) { in.k.dtype = DType::kFp16; }},
      {{"weights missing", absl::StatusCode::kInvalidArgument, "weights: expected"},
       [](LayerInput& in) { in.weights.present = false; }},
      {{"unknown layer", absl::StatusCode::kNotFound, "layer"},
       [](LayerInput& in) { in.layer = 99; }},
      {{"negative layer", absl::StatusCode::kNotFound, "layer"},
       [](LayerInput& in) { in.layer = -1; }},
  };
  for (auto& [c, mutate] : cases) {
    SCOPED_TRACE(c.name);
    auto step = engine_->BeginStep(Spec(seqs));
    ASSERT_TRUE(step.ok()) << step.status();
    LayerInput in = Input(0, data[0]);
    mutate(in);
    auto out = (*step)->RunLayer(in);
    step->reset();
    ExpectRejected(out.status(), c.code, c.field, before);
  }
}

TEST_F(EngineTest, NonFiniteInputsRejected) {
  RunStep({{"a", 10}});
  const std::string before = Digest();
  std::vector<LayerData> data = shadow_->Make({{"a", 8}});
  for (int which = 0; which < 3; ++which) {
    auto step = engine_->BeginStep(Spec({{"a", 8}}));
    ASSERT_TRUE(step.ok());
    std::vector<LayerData> d = data;
    const char* field = which == 0 ? "k" : which == 1 ? "q" : "weights";
    (which == 0 ? d[0].k_float : which == 1 ? d[0].q_float : d[0].weights)[3] = NAN;
    auto out = (*step)->RunLayer(Input(0, d[0]));
    step->reset();
    ExpectRejected(out.status(), absl::StatusCode::kInvalidArgument,
                   std::string(field) + ": element 3 is NaN", before);
  }
  // A pre-quantized FP8 entry with an e4m3 NaN code.
  auto step = engine_->BeginStep(Spec({{"a", 8}}));
  std::vector<LayerData> d = data;
  d[1].k_quant[5] = 0x7f;
  auto out = (*step)->RunLayer(Input(1, d[1]));
  step->reset();
  ExpectRejected(out.status(), absl::StatusCode::kInvalidArgument, "k: entry 0", before);
}

// Device tensors on the cpu backend: shapes are checked as for host ones,
// then FAILED_PRECONDITION, and nothing changes. The pointers are host
// memory flagged as device: the core must not read them (a read would not
// fail, so the digest and the codes are what is checked).
TensorView OnDevice(TensorView v) {
  v.on_device = true;
  v.device_ptr = v.data.data();
  v.device_bytes = static_cast<int64_t>(v.data.size());
  v.data = {};
  return v;
}

TEST_F(EngineTest, DeviceTensorsNeedTheGpuBackend) {
  RunStep({{"a", 40}, {"b", 3}});
  const std::string before = Digest();
  const std::vector<SeqStep> seqs = {{"a", 2}, {"b", 1}};
  std::vector<LayerData> data = shadow_->Make(seqs);
  std::vector<int32_t> out_buf(64 * 64);
  std::vector<std::pair<BadCase, std::function<void(LayerInput&)>>> cases = {
      {{"device k (fp32)", absl::StatusCode::kFailedPrecondition, "device tensors need the gpu backend"},
       [](LayerInput& in) { in.k = OnDevice(in.k); }},
      {{"device q + weights (native)", absl::StatusCode::kFailedPrecondition, "device tensors need the gpu backend"},
       [](LayerInput& in) {
         in.q = OnDevice(in.q);
         in.q_scale = in.q_scale.present ? OnDevice(in.q_scale) : in.q_scale;
         in.weights = OnDevice(in.weights);
       }},
      {{"device weights only (host copy)", absl::StatusCode::kFailedPrecondition, "weights: device tensors need the gpu backend"},
       [](LayerInput& in) { in.weights = OnDevice(in.weights); }},
      {{"device output", absl::StatusCode::kFailedPrecondition, "device tensors need the gpu backend"},
       [&](LayerInput& in) {
         in.out_device = out_buf.data();
         in.out_device_bytes = 0;  // replaced below with the right size
       }},
      {{"device k, short", absl::StatusCode::kInvalidArgument, "k: expected"},
       [](LayerInput& in) {
         in.k = OnDevice(in.k);
         in.k.device_bytes -= 4;
       }},
  };
  for (size_t li : {size_t{0}, size_t{1}}) {
    for (auto& [c, mutate] : cases) {
      SCOPED_TRACE(c.name + " layer " + std::to_string(li));
      auto step = engine_->BeginStep(Spec(seqs));
      ASSERT_TRUE(step.ok()) << step.status();
      LayerInput in = Input(li, data[li]);
      mutate(in);
      if (in.out_device != nullptr) {
        in.out_device_bytes = int64_t{data[li].rows} * layers_[li].topk * 4;
      }
      auto out = (*step)->RunLayer(in);
      step->reset();
      ExpectRejected(out.status(), c.code, c.field, before);
    }
  }
  // Bulk import of device K: the same refusal.
  std::vector<std::pair<int32_t, TensorView>> layers;
  std::vector<LayerData> imp = shadow_->Make({{"new", 5}});
  for (size_t li = 0; li < layers_.size(); ++li) {
    layers.push_back({layers_[li].layer, OnDevice(Input(li, imp[li]).k)});
  }
  auto n = engine_->Import(SeqName::Named("new"), true, 5, layers);
  ExpectRejected(n.status(), absl::StatusCode::kFailedPrecondition,
                 "device tensors need the gpu backend", before);
}

TEST_F(EngineTest, LayerSentTwice) {
  RunStep({{"a", 10}});
  const std::string before = Digest();
  auto step = engine_->BeginStep(Spec({{"a", 1}}));
  std::vector<LayerData> data = shadow_->Make({{"a", 1}});
  ASSERT_TRUE((*step)->RunLayer(Input(0, data[0])).ok());
  auto again = (*step)->RunLayer(Input(0, data[0]));
  step->reset();
  ExpectRejected(again.status(), absl::StatusCode::kFailedPrecondition, "layer 0 was already sent",
                 before);
}

TEST_F(EngineTest, CommitNeedsEveryLayer) {
  RunStep({{"a", 10}});
  const std::string before = Digest();
  auto step = engine_->BeginStep(Spec({{"a", 1}}));
  std::vector<LayerData> data = shadow_->Make({{"a", 1}});
  ASSERT_TRUE((*step)->RunLayer(Input(0, data[0])).ok());
  auto lens = (*step)->Commit();
  step->reset();
  ExpectRejected(lens.status(), absl::StatusCode::kFailedPrecondition, "commit: 3 layers not sent",
                 before);
}

TEST_F(EngineTest, BadHeaders) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8"}, {.format = "mxfp4", .compress_ratio = 4}});
  cfg.set_max_seq_len(12);
  Init(cfg);
  RunStep({{"a", 10}, {"b", 4}});
  const std::string before = Digest();
  const int64_t max_q = engine_->model().config.max_q_len();
  struct HeaderCase {
    BadCase c;
    StepSpec spec;
  };
  auto named = [](const std::string& s, int64_t q, bool create = false) {
    return StepSequenceSpec{SeqName::Named(s), q, create};
  };
  std::vector<HeaderCase> cases = {
      {{"empty", absl::StatusCode::kInvalidArgument, "header.sequences: expected at least one"}, {}},
      {{"q_len 0", absl::StatusCode::kInvalidArgument, "header.sequences[1].q_len: expected 1.."},
       {{named("a", 1), named("b", 0)}}},
      {{"q_len too big", absl::StatusCode::kInvalidArgument, "header.sequences[0].q_len"},
       {{named("a", max_q + 1)}}},
      {{"past max_seq_len", absl::StatusCode::kInvalidArgument, "max_seq_len"},
       {{named("b", 1), named("a", 3)}}},
      {{"unknown", absl::StatusCode::kNotFound, "header.sequences[1].id: unknown sequence \"zz\""},
       {{named("a", 1), named("zz", 1)}}},
      {{"create existing", absl::StatusCode::kAlreadyExists, "header.sequences[0].id"},
       {{named("a", 1, true)}}},
      {{"twice", absl::StatusCode::kInvalidArgument, "header.sequences[2].id: sequence \"a\" appears twice"},
       {{named("a", 1), named("b", 1), named("a", 1)}}},
  };
  for (auto& [c, spec] : cases) {
    SCOPED_TRACE(c.name);
    auto step = engine_->BeginStep(spec);
    ASSERT_FALSE(step.ok());
    ExpectRejected(step.status(), c.code, c.field, before);
  }
}

TEST_F(EngineTest, SequenceInTwoOpenSteps) {
  RunStep({{"a", 10}, {"b", 4}});
  const std::string before = Digest();
  auto first = engine_->BeginStep(Spec({{"a", 1}}));
  ASSERT_TRUE(first.ok());
  auto second = engine_->BeginStep(Spec({{"b", 1}, {"a", 1}}));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("header.sequences[1].id: sequence \"a\" is in another open step"));
  // Release of a busy sequence is refused too.
  auto rel = engine_->Release({SeqName::Named("a")});
  EXPECT_EQ(rel.status().code(), absl::StatusCode::kFailedPrecondition);
  first->reset();
  ExpectRejected(second.status(), absl::StatusCode::kFailedPrecondition, "another open step", before);
}

TEST_F(EngineTest, PoolExhaustedAllocatesNothing) {
  RunStep({{"a", 100}});
  const std::string before = Digest();
  // 64 pages of 16 entries per layer: 1024 entries in group 0.
  auto step = engine_->BeginStep(Spec({{"a", 500}, {"new", 500}}));
  ASSERT_FALSE(step.ok());
  ExpectRejected(step.status(), absl::StatusCode::kResourceExhausted,
                 "pages: layer group 'g0' needs", before);
  EXPECT_FALSE(engine_->SequenceLength(SeqName::Named("new")).ok());
}

TEST_F(EngineTest, AbortedStepLeavesNothing) {
  RunStep({{"a", 17}});
  const std::string before = Digest();
  {
    auto step = engine_->BeginStep(Spec({{"a", 40}, {"fresh", 33}}));
    ASSERT_TRUE(step.ok());
    std::vector<LayerData> data = shadow_->Make({{"a", 40}, {"fresh", 33}});
    for (size_t li = 0; li < layers_.size(); ++li) {
      ASSERT_TRUE((*step)->RunLayer(Input(li, data[li])).ok());
    }
    // Dropped without Commit, as when a client goes away.
  }
  EXPECT_EQ(Digest(), before);
  EXPECT_FALSE(engine_->SequenceLength(SeqName::Named("fresh")).ok());
  EXPECT_TRUE(engine_->CheckInvariants().ok());
  RunStep({{"a", 1}});  // the sequence is usable again
}

TEST_F(EngineTest, ReleaseReturnsAllPages) {
  const std::vector<GroupUsage> empty = engine_->Usage();
  RunStep({{"a", 70}, {"b", 3}});
  auto unknown = engine_->Release({SeqName::Named("a"), SeqName::Named("nope")});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("ids[1]"));
  auto freed = engine_->Release({SeqName::Named("a"), SeqName::Named("b")});
  ASSERT_TRUE(freed.ok());
  // g0: ceil(70/16) + ceil(3/16); g1 (r = 4): ceil(17/16) + 0.
  // g0 (E = 16, r = 1): 5 + 1 pages; g1 (r = 4): 17 entries -> 2 pages + 0.
  EXPECT_EQ(*freed, 8);
  const std::vector<GroupUsage> after = engine_->Usage();
  for (size_t g = 0; g < after.size(); ++g) EXPECT_EQ(after[g].free_pages, empty[g].free_pages);
}

// Seeded random sequences of steps (commit or abort), releases and steps
// that cannot get pages; the invariant and the lengths hold after each.
TEST_F(EngineTest, RandomOperationsKeepInvariant) {
  Init(MakeConfig({{.format = "fp8", .page_entries = 3, .num_layers = 1, .heads = 2, .topk = 4,
                    .pages = 40},
                   {.format = "mxfp4", .page_entries = 5, .compress_ratio = 2, .num_layers = 1,
                    .heads = 2, .topk = 4, .pages = 30}}));
  std::mt19937 rng(7);
  std::map<std::string, int64_t> lens;
  int releases = 0, exhausted = 0, rollbacks = 0, commits = 0;
  for (int op = 0; op < 300; ++op) {
    const int kind = rng() % 10;
    if (kind < 2 && !lens.empty()) {  // release one
      auto it = std::next(lens.begin(), rng() % lens.size());
      ASSERT_TRUE(engine_->Release({SeqName::Named(it->first)}).ok());
      lens.erase(it);
      ++releases;
      continue;
    }
    std::vector<StepSequenceSpec> seqs;
    std::vector<std::string> names;
    const int n = 1 + rng() % 3;
    for (int i = 0; i < n; ++i) {
      const std::string s = "s" + std::to_string(rng() % 8);
      if (std::find(names.begin(), names.end(), s) != names.end()) continue;
      names.push_back(s);
      seqs.push_back({SeqName::Named(s), 1 + static_cast<int64_t>(rng() % (kind == 9 ? 200 : 20)),
                      !lens.count(s)});
    }
    StepSpec spec;
    spec.seqs = seqs;
    auto step = engine_->BeginStep(spec);
    if (!step.ok()) {
      ASSERT_EQ(step.status().code(), absl::StatusCode::kResourceExhausted) << step.status();
      ++exhausted;
    } else if (rng() % 3 == 0) {
      step->reset();  // rollback
      ++rollbacks;
    } else {
      // Write every layer (import-style) and commit.
      for (const TestLayer& t : layers_) {
        int64_t n_new = 0;
        for (size_t i = 0; i < seqs.size(); ++i) {
          const int64_t old = lens.count(names[i]) ? lens[names[i]] : 0;
          n_new += NewEntriesFor(old, seqs[i].q_len, t.compress_ratio);
        }
        std::vector<float> k(n_new * t.layout.head_dim, 0.5f);
        ASSERT_TRUE((*step)->WriteLayer(t.layer, View(DType::kFp32, {n_new, t.layout.head_dim},
                                                      k.data(), k.size() * 4))
                        .ok());
      }
      ASSERT_TRUE((*step)->Commit().ok());
      for (size_t i = 0; i < seqs.size(); ++i) lens[names[i]] += seqs[i].q_len;
      ++commits;
    }
    ASSERT_TRUE(engine_->CheckInvariants().ok()) << "op " << op << ": " << engine_->CheckInvariants();
    for (const auto& [s, len] : lens) {
      ASSERT_EQ(*engine_->SequenceLength(SeqName::Named(s)), len) << "op " << op;
    }
  }
  // The seed exercises every kind of operation.
  EXPECT_GT(releases, 10);
  EXPECT_GT(exhausted, 5);
  EXPECT_GT(rollbacks, 10);
  EXPECT_GT(commits, 20);
}

// ------------------------------------------------ candidate and block paths --

class TwoLevelTest : public EngineTest {
 protected:
  void SetUp() override {
    // Layer 0 source, 1-2 consumers (4-entry blocks, pools of 3 blocks);
    // layer 3 a block layer (16-entry blocks, top 3, init 1, local 1).
    Init(MakeConfig({{.format = "fp8", .page_entries = 16, .num_layers = 3, .pages = 128,
                      .cand_block = 4, .cand_topk_blocks = 3},
                     {.format = "mxfp4", .page_entries = 16, .num_layers = 1, .heads = 2,
                      .pages = 128, .block_topk = 3, .init_blocks = 1, .local_blocks = 1}}));
  }
};

TEST_F(TwoLevelTest, PathsMatchReference) {
  RunStep({{"a", 1}});                      // a single entry
  RunStep({{"a", 15}, {"b", 16}});          // b ends exactly on a block boundary
  RunStep({{"b", 1}, {"a", 1}, {"c", 70}}); // one past a boundary; a long prefill
  RunStep({{"c", 2}, {"a", 2}});
  EXPECT_GT(shadow_->consumer_rows(), 0);
  EXPECT_LE(shadow_->ambiguous_rows() * 50, shadow_->consumer_rows());
}

TEST_F(TwoLevelTest, ConsumerBeforeSourceFails) {
  RunStep({{"a", 30}});
  const std::string before = Digest();
  auto step = engine_->BeginStep(Spec({{"a", 2}}));
  ASSERT_TRUE(step.ok());
  std::vector<LayerData> data = shadow_->Make({{"a", 2}});
  auto out = (*step)->RunLayer(Input(1, data[1]));
  step->reset();
  ExpectRejected(out.status(), absl::StatusCode::kFailedPrecondition,
                 "candidate consumer layer 1 needs its source layer 0", before);
}

TEST_F(TwoLevelTest, RolledBackStepLeavesNoPool) {
  RunStep({{"a", 30}});
  const std::string before = Digest();
  {
    auto step = engine_->BeginStep(Spec({{"a", 2}}));
    std::vector<LayerData> data = shadow_->Make({{"a", 2}});
    ASSERT_TRUE((*step)->RunLayer(Input(0, data[0])).ok());  // builds the pools
  }  // rolled back
  EXPECT_EQ(Digest(), before);
  auto step = engine_->BeginStep(Spec({{"a", 2}}));
  std::vector<LayerData> data = shadow_->Make({{"a", 2}});
  auto out = (*step)->RunLayer(Input(1, data[1]));
  EXPECT_EQ(out.status().code(), absl::StatusCode::kFailedPrecondition) << out.status();
  step->reset();
  RunStep({{"a", 2}});
}

TEST(ModelTest, RejectsBadRoleConfigs) {
  auto expect = [](config::ServerConfig cfg, const std::string& field) {
    auto m = BuildModel(cfg);
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(field));
  };
  config::ServerConfig block = MakeConfig({{.format = "mxfp4", .block_topk = 4}});
  block.mutable_groups(0)->mutable_block()->set_score("mean");
  expect(block, "groups[0].block.score: expected \"max\"");
  config::ServerConfig fp8_block = MakeConfig({{.format = "fp8", .block_topk = 4}});
  expect(fp8_block, "groups[0].kv_format: expected \"mxfp4\" for a BLOCK group");
  config::ServerConfig cand = MakeConfig({{.format = "fp8", .num_layers = 3, .cand_block = 4,
                                           .cand_topk_blocks = 2}});
  cand.mutable_groups(0)->mutable_candidates(0)->set_source_layer(2);
  expect(cand, "consumers: layer 1 comes before its source layer 2");
  config::ServerConfig zero = MakeConfig({{.format = "fp8", .num_layers = 2, .cand_block = 4,
                                           .cand_topk_blocks = 2}});
  zero.mutable_groups(0)->mutable_candidates(0)->set_candidate_block_size(0);
  expect(zero, "candidate_block_size: expected 1..");
  config::ServerConfig twice = MakeConfig({{.format = "fp8", .num_layers = 3, .cand_block = 4,
                                            .cand_topk_blocks = 2}});
  *twice.mutable_groups(0)->add_candidates() = twice.groups(0).candidates(0);
  expect(twice, "already has the role");
}

}  // namespace
}  // namespace indexer::testing

namespace indexer::testing {
namespace {

// A backend without the candidate and block paths is refused at start.
class DenseOnlyBackend : public CpuBackend {
 public:
  DenseOnlyBackend() : CpuBackend(1) {}
  Paths SupportedPaths() const override { return {}; }
};

TEST(EngineCreateTest, RefusesRolesTheBackendLacks) {
  auto model = BuildModel(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 4,
                                       .cand_block = 4, .cand_topk_blocks = 2}}));
  ASSERT_TRUE(model.ok());
  auto engine = Engine::Create(*model, std::make_unique<DenseOnlyBackend>());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(engine.status().message()),
              HasSubstr("layer 0 is a candidate_source layer"));
  EXPECT_TRUE(Engine::Create(*model, std::make_unique<CpuBackend>(1)).ok());
}

}  // namespace
}  // namespace indexer::testing

namespace indexer::testing {
namespace {

TEST(TensorTest, CheckTensorFiniteNamesTheFirstBadElement) {
  std::vector<float> f(1000, 1.0f);
  f[700] = INFINITY;
  f[900] = NAN;
  TensorView t = View(DType::kFp32, {1000}, f.data(), f.size() * 4);
  EXPECT_THAT(std::string(CheckTensorFinite("w", t).message()), HasSubstr("w: element 700 is"));
  std::vector<uint16_t> h(64, 0x3f80);  // bf16 1.0
  h[63] = 0xff80;                        // bf16 -inf
  t = View(DType::kBf16, {64}, h.data(), h.size() * 2);
  EXPECT_THAT(std::string(CheckTensorFinite("q", t).message()), HasSubstr("q: element 63 is"));
  std::vector<uint8_t> b(33, 0x7e);      // e4m3 448, finite
  EXPECT_TRUE(CheckTensorFinite("q", View(DType::kFp8E4m3, {33}, b.data(), 33)).ok());
  b[32] = 0xff;                          // e4m3fn NaN
  EXPECT_THAT(std::string(CheckTensorFinite("q", View(DType::kFp8E4m3, {33}, b.data(), 33)).message()),
              HasSubstr("q: element 32 is"));
  // Inside the word scan, and the largest finite values next to NaN/Inf.
  std::vector<uint8_t> big(10000, 0xfe);  // e4m3 -448
  EXPECT_TRUE(CheckTensorFinite("q", View(DType::kFp8E4m3, {10000}, big.data(), 10000)).ok());
  big[5001] = 0x7f;
  big[9000] = 0xff;
  EXPECT_THAT(std::string(CheckTensorFinite("q", View(DType::kFp8E4m3, {10000}, big.data(), 10000)).message()),
              HasSubstr("q: element 5001 is"));
  std::vector<uint16_t> hb(5000, 0xff7f);  // bf16 -max finite
  EXPECT_TRUE(CheckTensorFinite("k", View(DType::kBf16, {5000}, hb.data(), 10000)).ok());
  hb[4097] = 0x7fc1;                        // bf16 NaN
  EXPECT_THAT(std::string(CheckTensorFinite("k", View(DType::kBf16, {5000}, hb.data(), 10000)).message()),
              HasSubstr("k: element 4097 is"));
  std::vector<uint32_t> fb(9000, 0x7f7fffffu);  // fp32 max finite
  EXPECT_TRUE(CheckTensorFinite("w", View(DType::kFp32, {9000}, fb.data(), 36000)).ok());
  fb[8191] = 0xff800000u;                        // -inf
  EXPECT_THAT(std::string(CheckTensorFinite("w", View(DType::kFp32, {9000}, fb.data(), 36000)).message()),
              HasSubstr("w: element 8191 is"));
}

// The vector scan: a single bad element at every position of tensors that
// end inside a vector and a block, with the data at an odd address, and
// each dtype's all-ones codes beside its largest finite ones.
TEST(TensorTest, CheckTensorFiniteFindsEveryPosition) {
  struct Case {
    DType dtype;
    int size;
    uint32_t finite, bad;
  };
  for (const Case& c : {Case{DType::kFp8E4m3, 1, 0x7e, 0x7f}, Case{DType::kFp8E4m3, 1, 0xfe, 0xff},
                        Case{DType::kBf16, 2, 0x7f7f, 0x7f80}, Case{DType::kBf16, 2, 0xff7f, 0xffc0},
                        Case{DType::kFp32, 4, 0x7f7fffffu, 0x7f800000u},
                        Case{DType::kFp32, 4, 0xff7fffffu, 0xffc00001u}}) {
    for (int n : {1, 63, 64, 65, 4095, 4096 + 77, 2 * 4096 + 131}) {
      std::vector<char> raw(static_cast<size_t>(n) * c.size + 1);
      char* data = raw.data() + 1;  // odd address
      auto put = [&](int i, uint32_t v) { memcpy(data + i * c.size, &v, c.size); };
      for (int i = 0; i < n; ++i) put(i, c.finite);
      ASSERT_TRUE(CheckTensorFinite("t", View(c.dtype, {n}, data, n * c.size)).ok()) << n;
      std::vector<int> positions;
      for (int i = 0; i < n; i += n > 300 ? 61 : 1) positions.push_back(i);
      positions.push_back(n - 1);
      for (int bad : positions) {
        put(bad, c.bad);
        EXPECT_THAT(std::string(CheckTensorFinite("t", View(c.dtype, {n}, data, n * c.size)).message()),
                    HasSubstr(absl::StrCat("t: element ", bad, " is")))
            << DTypeName(c.dtype) << " n " << n;
        put(bad, c.finite);
      }
    }
  }
}

}  // namespace
}  // namespace indexer::testing
