// e4m3fnuz caches (SPEC §3) on the cpu backend, without gRPC: the group
// config's fp8_variant, steps on an e4m3fnuz cache against the shadow
// reference, e4m3fn inputs converted into it (exactly: the results equal the
// reference computed from the e4m3fn codes), e4m3fnuz inputs converted into
// an e4m3fn cache, and the conversion's refusals (NaN codes, 0x80, fields
// set where they mean nothing), each leaving the cache as it was.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/format/fp8.h"
#include "server/core/engine.h"
#include "server/core/layer_inputs.h"
#include "tests/integration/test_config.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;

constexpr Fp8Variant kFn = Fp8Variant::kE4m3fn;
constexpr Fp8Variant kFnuz = Fp8Variant::kE4m3fnuz;

TensorView View(DType dtype, std::vector<int64_t> shape, const void* data, size_t bytes) {
  TensorView v;
  v.present = true;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.data = absl::string_view(static_cast<const char*>(data), bytes);
  return v;
}

DType Fp8DType(Fp8Variant v) {
  return v == kFnuz ? DType::kFp8E4m3fnuz : DType::kFp8E4m3;
}

TEST(Fp8VariantConfig, ParsedAndChecked) {
  auto m = BuildModel(MakeConfig({{.format = "fp8", .fp8_variant = "e4m3fnuz"},
                                  {.format = "fp8"}}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->groups[0].layout.fp8, kFnuz);
  EXPECT_EQ(m->groups[1].layout.fp8, kFn);
  EXPECT_STREQ(Fp8VariantName(m->groups[0].layout.fp8), "e4m3fnuz");

  auto bad = BuildModel(MakeConfig({{.format = "fp8", .fp8_variant = "e5m2"}}));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("groups[0].fp8_variant"));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("e4m3fnuz"));

  auto mx = BuildModel(MakeConfig({{.format = "mxfp4", .fp8_variant = "e4m3fnuz"}}));
  ASSERT_FALSE(mx.ok());
  EXPECT_THAT(std::string(mx.status().message()), HasSubstr("groups[0].fp8_variant"));
}

// An engine whose FP8 group holds `cache` codes, and a shadow whose layers
// generate (and compute the reference from) `inputs` codes.
class Fp8VariantEngine : public ::testing::Test {
 protected:
  void Init(Fp8Variant cache, Fp8Variant inputs) {
    inputs_ = inputs;
    auto model = BuildModel(MakeConfig(
        {{.format = "fp8", .fp8_variant = cache == kFnuz ? "e4m3fnuz" : "e4m3fn"},
         {.format = "fp8", .tiled = true, .num_layers = 1,
          .fp8_variant = cache == kFnuz ? "e4m3fnuz" : "e4m3fn"}}));
    ASSERT_TRUE(model.ok()) << model.status();
    layers_ = TestLayers(*model);
    for (TestLayer& t : layers_) t.layout.fp8 = inputs;
    auto engine = Engine::Create(*std::move(model), std::make_unique<CpuBackend>(2));
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = *std::move(engine);
    shadow_ = std::make_unique<Shadow>(layers_, 77);
  }

  StepSpec Spec(const std::vector<SeqStep>& seqs) {
    StepSpec spec;
    for (const auto& [s, q] : seqs) spec.seqs.push_back({SeqName::Named(s), q, shadow_->len(s) == 0});
    return spec;
  }

  // Pre-quantized K and FP8 Q in the inputs' variant, or FP32 K and Q.
  LayerInput Input(size_t li, const LayerData& d, bool fp32) {
    const TestLayer& t = layers_[li];
    const int64_t D = t.layout.head_dim, H = t.num_heads;
    LayerInput in;
    in.layer = t.layer;
    if (fp32) {
      in.k = View(DType::kFp32, {d.n_new, D}, d.k_float.data(), d.k_float.size() * 4);
      in.q = View(DType::kFp32, {d.rows, H, D}, d.q_float.data(), d.q_float.size() * 4);
      in.weights = View(DType::kFp32, {d.rows, H}, d.weights.data(), d.weights.size() * 4);
      return in;
    }
    in.k = View(DType::kUint8, {d.n_new, t.layout.entry_bytes()}, d.k_quant.data(),
                d.k_quant.size());
    in.k.fp8_codes = Fp8DType(inputs_);
    in.q = View(Fp8DType(inputs_), {d.rows, H, D}, d.q_codes.data(), d.q_codes.size());
    in.weights = View(DType::kFp32, {d.rows, H}, d.w_folded.data(), d.w_folded.size() * 4);
    return in;
  }

  void RunStep(const std::vector<SeqStep>& seqs, bool fp32) {
    auto step = engine_->BeginStep(Spec(seqs));
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<LayerData> data = shadow_->Make(seqs);
    for (size_t li = 0; li < layers_.size(); ++li) {
      auto out = (*step)->RunLayer(Input(li, data[li], fp32));
      ASSERT_TRUE(out.ok()) << out.status();
      shadow_->Check(li, seqs, data[li], out->indices.data());
    }
    auto lens = (*step)->Commit();
    ASSERT_TRUE(lens.ok()) << lens.status();
    shadow_->Commit(seqs, data);
  }

  Fp8Variant inputs_ = kFn;
  std::vector<TestLayer> layers_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Shadow> shadow_;
};

// FP32 inputs quantized by the daemon into e4m3fnuz (FP8_MAX 240), and
// pre-quantized e4m3fnuz inputs taken as they are.
TEST_F(Fp8VariantEngine, FnuzCacheMatchesReference) {
  Init(kFnuz, kFnuz);
  RunStep({{"a", 40}, {"b", 70}}, /*fp32=*/true);
  RunStep({{"a", 1}, {"b", 1}}, /*fp32=*/false);
  RunStep({{"a", 1}, {"b", 1}}, /*fp32=*/true);
}

// e4m3fn K and Q into an e4m3fnuz cache: converted exactly (codes halved,
// entry scale and head weight doubled), so the top-k is the reference's
// computed from the e4m3fn codes, and the stored entries decode to the
// same values.
TEST_F(Fp8VariantEngine, FnInputsConvertedExactlyIntoFnuzCache) {
  Init(kFnuz, kFn);
  RunStep({{"a", 40}, {"b", 70}}, /*fp32=*/false);
  RunStep({{"a", 1}, {"b", 1}}, /*fp32=*/false);
  const TestLayer& t = layers_[0];
  const PageLayout cache = engine_->model().groups[0].layout;
  ASSERT_EQ(cache.fp8, kFnuz);
  auto pages = engine_->SequencePages(SeqName::Named("a"), 0);
  ASSERT_TRUE(pages.ok());
  std::vector<uint8_t> e(cache.entry_bytes());
  ASSERT_TRUE(engine_->backend().ReadEntries(cache, engine_->pool(t.layer), (*pages)[0], 3, 1,
                                             e.data()).ok());
  float s;
  std::memcpy(&s, e.data() + cache.value_bytes(), 4);
  const RefEntry want = shadow_->Entry(t.layer, "a", 3);
  EXPECT_EQ(static_cast<double>(s), 2 * want.scale);
  for (int d = 0; d < cache.head_dim; ++d) {
    ASSERT_NE(e[d], 0x80) << d;
    EXPECT_EQ(DecodeE4m3fnuz(e[d]) * 2.0, want.k[d]) << d;
  }
}

TEST_F(Fp8VariantEngine, FnuzInputsConvertedIntoFnCache) {
  Init(kFn, kFnuz);
  // fnuz -> fn rounds values below 2^-6 of the scale: compare values, not
  // the reference top-k (the shadow holds the fnuz values).
  const std::vector<SeqStep> seqs = {{"a", 20}};
  auto step = engine_->BeginStep(Spec(seqs));
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<LayerData> data = shadow_->Make(seqs);
  for (size_t li = 0; li < layers_.size(); ++li) {
    ASSERT_TRUE((*step)->RunLayer(Input(li, data[li], false)).ok());
  }
  ASSERT_TRUE((*step)->Commit().ok());
  const PageLayout cache = engine_->model().groups[0].layout;
  auto pages = engine_->SequencePages(SeqName::Named("a"), 0);
  ASSERT_TRUE(pages.ok());
  std::vector<uint8_t> e(cache.entry_bytes());
  for (int entry = 0; entry < 16; ++entry) {
    ASSERT_TRUE(engine_->backend().ReadEntries(cache, engine_->pool(0), (*pages)[0], entry, 1,
                                               e.data()).ok());
    const uint8_t* src = data[0].k_quant.data() + entry * cache.entry_bytes();
    EXPECT_EQ(std::memcmp(e.data() + cache.value_bytes(), src + cache.value_bytes(), 4), 0)
        << "scale kept";
    for (int d = 0; d < cache.head_dim; ++d) {
      EXPECT_EQ(e[d], EncodeE4m3(DecodeE4m3fnuz(src[d]))) << entry << " " << d;
    }
  }
}

// ---------------------------------------------------- layer inputs alone --

class Fp8VariantInputs : public ::testing::Test {
 protected:
  Fp8VariantInputs() {
    auto m = BuildModel(MakeConfig({{.format = "fp8", .heads = 2, .fp8_variant = "e4m3fnuz"},
                                    {.format = "fp8", .heads = 2},
                                    {.format = "mxfp4", .heads = 2}}));
    EXPECT_TRUE(m.ok()) << m.status();
    fnuz_ = m->groups[0];
    fn_ = m->groups[1];
    mx_ = m->groups[2];
  }
  // Two linear entries: codes 0x00..0x7e cycling, -0 at byte 5, scale 0.5.
  std::vector<uint8_t> Entries(const PageLayout& L) {
    std::vector<uint8_t> k(2 * L.entry_bytes());
    for (int e = 0; e < 2; ++e) {
      uint8_t* p = k.data() + e * L.entry_bytes();
      for (int b = 0; b < L.value_bytes(); ++b) p[b] = static_cast<uint8_t>((e * 61 + b * 7) % 0x7f);
      p[5] = 0x80;
      const float s = 0.5f;
      std::memcpy(p + L.value_bytes(), &s, 4);
    }
    return k;
  }
  GroupSpec fnuz_, fn_, mx_;
};

TEST_F(Fp8VariantInputs, KOfTheCacheVariantPassesThrough) {
  std::vector<uint8_t> k = Entries(fnuz_.layout);
  k[5] = 0x00;  // 0x80 is the fnuz NaN
  k[fnuz_.layout.entry_bytes() + 5] = 0x00;
  TensorView v = View(DType::kUint8, {2, fnuz_.layout.entry_bytes()}, k.data(), k.size());
  v.fp8_codes = DType::kFp8E4m3fnuz;
  std::vector<uint8_t> conv;
  auto out = ValidateK(fnuz_, 2, v, &conv);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->data, k.data());
  EXPECT_TRUE(conv.empty());
}

TEST_F(Fp8VariantInputs, FnKIntoFnuzCacheIsConverted) {
  const PageLayout& L = fnuz_.layout;
  std::vector<uint8_t> k = Entries(L);
  // Unset k_fp8 means e4m3fn, as before the field existed.
  TensorView v = View(DType::kUint8, {2, L.entry_bytes()}, k.data(), k.size());
  std::vector<uint8_t> conv;
  auto out = ValidateK(fnuz_, 2, v, &conv);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->data, conv.data());
  for (int e = 0; e < 2; ++e) {
    const uint8_t* src = k.data() + e * L.entry_bytes();
    const uint8_t* dst = conv.data() + e * L.entry_bytes();
    float s0, s1;
    std::memcpy(&s0, src + L.value_bytes(), 4);
    std::memcpy(&s1, dst + L.value_bytes(), 4);
    EXPECT_EQ(s1, 2 * s0);
    for (int b = 0; b < L.value_bytes(); ++b) {
      EXPECT_EQ(DecodeE4m3fnuz(dst[b]) * s1, DecodeE4m3(src[b]) * s0) << e << " " << b;
    }
    EXPECT_EQ(dst[5], 0x00);  // fn -0 has no fnuz code but zero
  }
  EXPECT_EQ(k[5], 0x80) << "the request's bytes are not touched";
}

TEST_F(Fp8VariantInputs, NanCodesOfTheSendersVariantRefused) {
  std::vector<uint8_t> conv;
  {
    std::vector<uint8_t> k = Entries(fnuz_.layout);  // byte 5 = 0x80: fnuz NaN
    TensorView v = View(DType::kUint8, {2, fnuz_.layout.entry_bytes()}, k.data(), k.size());
    v.fp8_codes = DType::kFp8E4m3fnuz;
    auto out = ValidateK(fnuz_, 2, v, &conv);
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(out.status().message()),
                HasSubstr("k: entry 0 value 5 is an e4m3fnuz NaN code"));
  }
  {
    std::vector<uint8_t> k = Entries(fn_.layout);
    k[9] = 0xff;  // fn NaN, sent into the fnuz cache
    TensorView v = View(DType::kUint8, {2, fnuz_.layout.entry_bytes()}, k.data(), k.size());
    auto out = ValidateK(fnuz_, 2, v, &conv);
    ASSERT_FALSE(out.ok());
    EXPECT_THAT(std::string(out.status().message()),
                HasSubstr("k: entry 0 value 9 is an e4m3fn NaN code"));
  }
}

TEST_F(Fp8VariantInputs, KFp8FieldRefusedWhereItMeansNothing) {
  std::vector<uint8_t> conv;
  std::vector<float> kf(128, 1.0f);
  TensorView v = View(DType::kFp32, {1, 128}, kf.data(), kf.size() * 4);
  v.fp8_codes = DType::kFp8E4m3fnuz;
  auto out = ValidateK(fnuz_, 1, v, &conv);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("k_fp8: expected unset"));

  std::vector<uint8_t> k = Entries(fn_.layout);
  TensorView u = View(DType::kUint8, {2, fn_.layout.entry_bytes()}, k.data(), k.size());
  u.fp8_codes = DType::kInt32;
  out = ValidateK(fn_, 2, u, &conv);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              HasSubstr("k_fp8: expected FP8_E4M3 or FP8_E4M3FNUZ"));

  std::vector<uint8_t> mk(2 * mx_.layout.entry_bytes(), 0x11);
  TensorView w = View(DType::kUint8, {2, mx_.layout.entry_bytes()}, mk.data(), mk.size());
  w.fp8_codes = DType::kFp8E4m3;
  out = ValidateK(mx_, 2, w, &conv);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("k_fp8"));
}

TEST_F(Fp8VariantInputs, QConvertedBothWays) {
  const int32_t rows = 3;
  const int64_t H = 2, D = 128;
  std::vector<uint8_t> q(rows * H * D);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>((i * 37) % 0x7f | (i % 3 ? 0 : 0x80));
  std::vector<float> w = {0.5f, -1.0f, 2.0f, 3.0f, -0.25f, 1.5f};
  TensorView wv = View(DType::kFp32, {rows, H}, w.data(), w.size() * 4);
  TensorView none;

  // e4m3fn Q into the fnuz cache: codes halved, weights doubled (exact).
  {
    QScratch scratch;
    TensorView qv = View(DType::kFp8E4m3, {rows, H, D}, q.data(), q.size());
    auto out = PrepareQ(fnuz_, rows, qv, none, wv, &scratch);
    ASSERT_TRUE(out.ok()) << out.status();
    for (int64_t i = 0; i < rows * H * D; ++i) {
      ASSERT_NE(out->values[i], 0x80) << i;
      EXPECT_EQ(DecodeE4m3fnuz(out->values[i]) * 2.0f, DecodeE4m3(q[i])) << i;
    }
    for (int64_t rh = 0; rh < rows * H; ++rh) EXPECT_EQ(out->weights[rh], 2 * w[rh]);
  }
  // e4m3fnuz Q into the fn cache: values kept (rounded below 2^-6).
  {
    std::vector<uint8_t> qz = q;
    for (uint8_t& c : qz) if (c == 0x80) c = 0x00;
    QScratch scratch;
    TensorView qv = View(DType::kFp8E4m3fnuz, {rows, H, D}, qz.data(), qz.size());
    auto out = PrepareQ(fn_, rows, qv, none, wv, &scratch);
    ASSERT_TRUE(out.ok()) << out.status();
    for (int64_t i = 0; i < rows * H * D; ++i) {
      EXPECT_EQ(out->values[i], EncodeE4m3(DecodeE4m3fnuz(qz[i]))) << i;
    }
    for (int64_t rh = 0; rh < rows * H; ++rh) EXPECT_EQ(out->weights[rh], w[rh]);
  }
  // 0x80 in an FP8_E4M3FNUZ Q is its NaN.
  {
    QScratch scratch;
    TensorView qv = View(DType::kFp8E4m3fnuz, {rows, H, D}, q.data(), q.size());
    auto out = PrepareQ(fnuz_, rows, qv, none, wv, &scratch);
    ASSERT_FALSE(out.ok());
    EXPECT_THAT(std::string(out.status().message()), HasSubstr("q: element 0 is NaN"));
  }
  // FP32 Q is quantized in the cache's variant (FP8_MAX 240).
  {
    std::vector<float> qf(rows * H * D);
    for (size_t i = 0; i < qf.size(); ++i) qf[i] = std::sin(0.1f * i) * 7.0f;
    QScratch scratch;
    TensorView qv = View(DType::kFp32, {rows, H, D}, qf.data(), qf.size() * 4);
    auto out = PrepareQ(fnuz_, rows, qv, none, wv, &scratch);
    ASSERT_TRUE(out.ok()) << out.status();
    std::vector<uint8_t> want(D);
    for (int64_t rh = 0; rh < rows * H; ++rh) {
      const float s = QuantizeFp8Q(&qf[rh * D], D, want.data(), kFnuz);
      EXPECT_EQ(out->weights[rh], w[rh] * s);
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(out->values[rh * D + d], want[d]) << rh << " " << d;
    }
  }
}

TEST_F(Fp8VariantInputs, DeviceQReadyOnlyInTheCacheVariant) {
  std::vector<uint8_t> q(2 * 128);
  std::vector<float> w(2);
  TensorView qv = View(DType::kFp8E4m3, {1, 2, 128}, q.data(), q.size());
  TensorView wv = View(DType::kFp32, {1, 2}, w.data(), 8);
  qv.on_device = wv.on_device = true;
  TensorView none;
  EXPECT_TRUE(DeviceQReady(fn_, qv, none, wv));
  EXPECT_FALSE(DeviceQReady(fnuz_, qv, none, wv));  // converted on the host path
  qv.dtype = DType::kFp8E4m3fnuz;
  EXPECT_TRUE(DeviceQReady(fnuz_, qv, none, wv));
}

}  // namespace
}  // namespace indexer::testing
