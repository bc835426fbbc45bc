// The wire side of inputs the step tests do not send: WriteEntries requests
// that must be refused (each naming WriteEntries' own field and changing
// nothing), and the other dtypes of Q and K (BF16 Q and K, FP8 Q on the
// block path) sent end to end and checked against the shadow reference.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "indexer/client.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// ------------------------------------------------------ WriteEntries errors --

// One FP8 group of two layers and an MXFP4 group at r = 4; imports of at
// most 256 tokens. SetUp imports "a" (30 tokens); every test then sends one
// bad request and checks the status, the field its message names, and that
// the cache is exactly as after SetUp.
class WriteEntriesErrors : public ::testing::Test {
 protected:
  static config::ServerConfig Config() {
    config::ServerConfig cfg =
        MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 32},
                    {.format = "mxfp4", .compress_ratio = 4, .num_layers = 1, .pages = 32}});
    cfg.set_max_q_len(256);
    return cfg;
  }
  WriteEntriesErrors() : d_(Config()), shadow_(d_.layers(), 41) {}

  void SetUp() override {
    auto len = d_.client().WriteEntries(Request("a", 30));
    ASSERT_TRUE(len.ok()) << len.status();
    ASSERT_EQ(*len, 30u);
    shadow_.Commit({{"a", 30}}, last_data_);
    usage_ = d_.engine().Usage();
  }

  // A valid import of `tokens` tokens to `name` (created when the shadow
  // does not hold it), pre-quantized entries; `fp32` sends FP32 K instead.
  v1::WriteEntriesRequest Request(const std::string& name, int64_t tokens, bool fp32 = false) {
    const std::vector<SeqStep> seqs = {{name, tokens}};
    std::vector<LayerData> data = shadow_.MakeEntries(seqs);
    v1::WriteEntriesRequest w;
    *w.mutable_id() = client::NamedSequenceId(name);
    w.set_create(shadow_.len(name) == 0);
    w.set_num_tokens(static_cast<uint64_t>(tokens));
    for (size_t li = 0; li < d_.layers().size(); ++li) {
      const TestLayer& t = d_.layers()[li];
      v1::LayerEntries* le = w.add_layers();
      le->set_layer(static_cast<uint32_t>(t.layer));
      *le->mutable_k() =
          fp32 ? client::MakeFp32Tensor(data[li].k_float, {data[li].n_new, t.layout.head_dim})
               : client::MakeByteTensor(v1::UINT8, data[li].k_quant,
                                        {data[li].n_new, t.layout.entry_bytes()});
    }
    last_data_ = std::move(data);
    return w;
  }

  // Sends `w` and expects `code` with `field` in the message (WriteEntries'
  // own field, never the step header's) and the cache as after SetUp.
  void ExpectRejected(const v1::WriteEntriesRequest& w, absl::StatusCode code,
                      const std::string& field) {
    auto len = d_.client().WriteEntries(w);
    ASSERT_FALSE(len.ok()) << "accepted: " << *len;
    const std::string msg(len.status().message());
    EXPECT_EQ(len.status().code(), code) << len.status();
    EXPECT_THAT(msg, HasSubstr(field));
    EXPECT_THAT(msg, Not(HasSubstr("header")));
    EXPECT_THAT(msg, Not(HasSubstr("q_len")));
    EXPECT_EQ(d_.engine().open_steps(), 0);
    EXPECT_EQ(*d_.engine().SequenceLength(SeqName::Named("a")), 30);
    EXPECT_FALSE(d_.engine().SequenceLength(SeqName::Named("new")).ok());
    EXPECT_EQ(d_.engine().num_sequences(), 1);
    const std::vector<GroupUsage> now = d_.engine().Usage();
    ASSERT_EQ(now.size(), usage_.size());
    for (size_t g = 0; g < now.size(); ++g) {
      EXPECT_EQ(now[g].free_pages, usage_[g].free_pages) << "group " << g;
    }
    EXPECT_TRUE(d_.engine().CheckInvariants().ok()) << d_.engine().CheckInvariants();
  }

  Daemon d_;
  Shadow shadow_;
  std::vector<GroupUsage> usage_;
  std::vector<LayerData> last_data_;
};

TEST_F(WriteEntriesErrors, WrongDtype) {
  v1::WriteEntriesRequest w = Request("new", 20);
  w.mutable_layers(0)->mutable_k()->set_dtype(v1::INT32);
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "layers[0].k: expected");
}

TEST_F(WriteEntriesErrors, WrongShape) {
  // The last layer's, so that the layers before it were written first.
  v1::WriteEntriesRequest w = Request("new", 20);
  w.mutable_layers(2)->mutable_k()->set_shape(1, 99);
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "layers[2].k: expected");
}

TEST_F(WriteEntriesErrors, ByteCountMismatch) {
  v1::WriteEntriesRequest w = Request("a", 8);
  w.mutable_layers(1)->mutable_k()->mutable_data()->pop_back();
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "layers[1].k: expected");
}

TEST_F(WriteEntriesErrors, MissingLayer) {
  v1::WriteEntriesRequest w = Request("new", 20);
  w.mutable_layers()->RemoveLast();
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "layers: layer 2 is missing");
}

TEST_F(WriteEntriesErrors, LayerTwice) {
  v1::WriteEntriesRequest w = Request("new", 20);
  w.mutable_layers(2)->set_layer(0);
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "layers[2].layer: layer 0 appears twice");
}

TEST_F(WriteEntriesErrors, UnknownLayer) {
  v1::WriteEntriesRequest w = Request("new", 20);
  w.mutable_layers(1)->set_layer(9);
  ExpectRejected(w, absl::StatusCode::kNotFound, "layers[1].layer: unknown layer 9");
}

TEST_F(WriteEntriesErrors, NumTokensZeroAndAboveMaxQLen) {
  v1::WriteEntriesRequest w = Request("new", 20);
  w.set_num_tokens(0);
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "num_tokens: expected 1..256, got 0");
  v1::WriteEntriesRequest big = Request("new", 257);
  ExpectRejected(big, absl::StatusCode::kInvalidArgument, "num_tokens: expected 1..256, got 257");
}

TEST_F(WriteEntriesErrors, CreateOnExistingSequence) {
  v1::WriteEntriesRequest w = Request("a", 4);
  w.set_create(true);
  ExpectRejected(w, absl::StatusCode::kAlreadyExists, "id: sequence \"a\" already exists");
}

TEST_F(WriteEntriesErrors, AppendToUnknownSequence) {
  v1::WriteEntriesRequest w = Request("new", 20);
  w.set_create(false);
  ExpectRejected(w, absl::StatusCode::kNotFound, "id: unknown sequence \"new\"");
}

TEST_F(WriteEntriesErrors, MissingId) {
  v1::WriteEntriesRequest w = Request("new", 20);
  w.clear_id();
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "id: expected");
}

TEST_F(WriteEntriesErrors, NanInFp32K) {
  // In the second layer's K: layer 0's entries are already in the pool when
  // it is found, and must not count.
  v1::WriteEntriesRequest w = Request("new", 20, /*fp32=*/true);
  std::string* bytes = w.mutable_layers(1)->mutable_k()->mutable_data();
  const float nan = std::nanf("");
  memcpy(bytes->data() + 4 * 130, &nan, 4);
  ExpectRejected(w, absl::StatusCode::kInvalidArgument, "layers[1].k: element 130 is NaN");
  // The same import without the NaN goes through (FP32 K is a valid form).
  v1::WriteEntriesRequest ok = Request("b", 20, /*fp32=*/true);
  auto len = d_.client().WriteEntries(ok);
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(*len, 20u);
  EXPECT_TRUE(d_.engine().CheckInvariants().ok()) << d_.engine().CheckInvariants();
}

// --------------------------------------------------- BF16 and FP8 Q, BF16 K --

// bf16 of x, round to nearest even (x finite), as its bits; written here
// rather than taken from the daemon so a slip there shows.
uint16_t Bf16Bits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float Bf16Value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
v1::Tensor Bf16Tensor(const std::vector<float>& values, std::vector<int64_t> shape) {
  std::vector<uint16_t> h(values.size());
  for (size_t i = 0; i < values.size(); ++i) h[i] = Bf16Bits(values[i]);
  return client::MakeTensor(v1::BF16, shape, h.data(), h.size() * 2);
}

// Recomputes the quantized forms of `d` from its (changed) float forms, as
// Shadow::Make does: K entries, Q codes and the folded weights.
void Requantize(const TestLayer& t, LayerData& d) {
  const PageLayout& L = t.layout;
  const int D = L.head_dim, H = t.num_heads, vb = L.value_bytes(), eb = L.entry_bytes();
  for (int64_t e = 0; e < d.n_new; ++e) {
    uint8_t* out = d.k_quant.data() + e * eb;
    if (L.format == KvFormat::kFp8) {
      const float s = QuantizeFp8Entry(&d.k_float[e * D], D, t.ue8m0, out);
      memcpy(out + vb, &s, 4);
    } else {
      QuantizeMxfp4(&d.k_float[e * D], D, out, out + vb);
    }
  }
  d.w_folded = d.weights;
  for (int64_t rh = 0; rh < d.rows * H; ++rh) {
    if (L.format == KvFormat::kFp8) {
      d.w_folded[rh] *= QuantizeFp8Q(&d.q_float[rh * D], D, &d.q_codes[rh * vb]);
    } else {
      QuantizeMxfp4(&d.q_float[rh * D], D, &d.q_codes[rh * vb], &d.q_scales[rh * (D / 32)]);
    }
  }
}

enum class QForm { kBf16QK, kFp8Q, kFp8QNoScale };

// The request of layer `t` in `form`; first rewrites `d`'s float values to
// what the daemon will see (bf16-rounded, or the e4m3 values of block Q), so
// that the shadow checks against exactly those.
v1::LayerRequest FormRequest(const TestLayer& t, LayerData& d, QForm form) {
  const int64_t D = t.layout.head_dim, H = t.num_heads;
  v1::LayerRequest r;
  r.set_layer(static_cast<uint32_t>(t.layer));
  if (form == QForm::kBf16QK) {
    for (float& x : d.k_float) x = Bf16Value(Bf16Bits(x));
    for (float& x : d.q_float) x = Bf16Value(Bf16Bits(x));
    Requantize(t, d);
    *r.mutable_k() = Bf16Tensor(d.k_float, {d.n_new, D});
    *r.mutable_q() = Bf16Tensor(d.q_float, {d.rows, H, D});
    if (t.role != Role::kBlock) *r.mutable_weights() = client::MakeFp32Tensor(d.weights, {d.rows, H});
    return r;
  }
  *r.mutable_k() = client::MakeFp32Tensor(d.k_float, {d.n_new, D});
  if (t.role == Role::kBlock) {
    // FP8_E4M3 block Q: with a power-of-two scale per (row, head), or the
    // codes of the values themselves (N(0, 1) fits e4m3's range).
    std::vector<uint8_t> codes(d.q_float.size());
    std::vector<float> scales(static_cast<size_t>(d.rows * H), 1.0f);
    for (int64_t rh = 0; rh < d.rows * H; ++rh) {
      float* q = &d.q_float[rh * D];
      uint8_t* c = &codes[rh * D];
      if (form == QForm::kFp8Q) {
        scales[rh] = QuantizeFp8Q(q, static_cast<int>(D), c);
      } else {
        for (int64_t i = 0; i < D; ++i) c[i] = EncodeE4m3(q[i]);
      }
      for (int64_t i = 0; i < D; ++i) q[i] = DecodeE4m3(c[i]) * scales[rh];
    }
    *r.mutable_q() = client::MakeByteTensor(v1::FP8_E4M3, codes, {d.rows, H, D});
    if (form == QForm::kFp8Q) *r.mutable_q_scale() = client::MakeFp32Tensor(scales, {d.rows, H});
    return r;
  }
  if (t.layout.format == KvFormat::kFp8) {
    // The dense FP8 form: codes with the scale folded into the weights.
    *r.mutable_q() = client::MakeByteTensor(v1::FP8_E4M3, d.q_codes, {d.rows, H, D});
    *r.mutable_weights() = client::MakeFp32Tensor(d.w_folded, {d.rows, H});
  } else {
    // An MXFP4 layer takes no FP8 Q: FP32, which the daemon quantizes.
    *r.mutable_q() = client::MakeFp32Tensor(d.q_float, {d.rows, H, D});
    *r.mutable_weights() = client::MakeFp32Tensor(d.weights, {d.rows, H});
  }
  return r;
}

// WireStep with FormRequest: every layer checked, then commit.
void FormStep(Daemon& d, Shadow& shadow, const std::vector<SeqStep>& seqs, QForm form) {
  auto step = d.client().OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<LayerData> data = shadow.Make(seqs);
  for (size_t li = 0; li < d.layers().size(); ++li) {
    const TestLayer& t = d.layers()[li];
    auto reply = (*step)->RunLayer(FormRequest(t, data[li], form));
    ASSERT_TRUE(reply.ok()) << "layer " << t.layer << ": " << reply.status();
    std::vector<int64_t> shape = {data[li].rows, t.topk};
    if (t.role == Role::kBlock) shape = {t.num_heads, data[li].rows, t.topk};
    auto topk = client::ReadInt32Tensor(reply->topk(), shape, "topk");
    ASSERT_TRUE(topk.ok()) << topk.status();
    shadow.Check(li, seqs, data[li], topk->data());
  }
  auto committed = (*step)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  shadow.Commit(seqs, data);
  ASSERT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

// Dense FP8 (r = 4, a candidate set), tiled MXFP4 and block layers; prefill,
// decode and a mixed step in each form.
TEST(WireFormsTest, Bf16AndFp8QueriesAndBf16Keys) {
  Daemon d(MakeConfig({{.format = "fp8", .page_entries = 16, .compress_ratio = 4, .num_layers = 2,
                        .pages = 128, .cand_block = 2, .cand_topk_blocks = 5},
                       {.format = "mxfp4", .page_entries = 16, .tiled = true, .num_layers = 1,
                        .pages = 128},
                       {.format = "mxfp4", .page_entries = 32, .num_layers = 1, .heads = 4,
                        .pages = 128, .block_topk = 4, .init_blocks = 1, .local_blocks = 1}}));
  Shadow shadow(d.layers(), 77);
  for (QForm form : {QForm::kBf16QK, QForm::kFp8Q, QForm::kFp8QNoScale}) {
    SCOPED_TRACE(static_cast<int>(form));
    const std::string p = "p" + std::to_string(static_cast<int>(form));
    FormStep(d, shadow, {{p, 200}, {"q" + p, 3}}, form);
    FormStep(d, shadow, {{p, 1}, {"q" + p, 1}}, form);
    FormStep(d, shadow, {{"q" + p, 40}, {p, 1}}, form);
  }
  EXPECT_GT(shadow.consumer_rows(), 0);
  EXPECT_LE(shadow.ambiguous_rows() * 50, shadow.consumer_rows());
}

// An e4m3fnuz cache over the wire: GetServerInfo reports each group's FP8
// variant; e4m3fn K (k_fp8 = FP8_E4M3) and FP8_E4M3 Q are converted exactly,
// so the top-k is the shadow's computed from the e4m3fn codes; an import
// whose LayerEntries.k_fp8 names e4m3fnuz is checked for that variant's NaN.
TEST(WireFp8VariantTest, FnuzCacheReportedAndFnInputsConverted) {
  Daemon d(MakeConfig({{.format = "fp8", .page_entries = 16, .num_layers = 2, .pages = 64,
                        .fp8_variant = "e4m3fnuz"},
                       {.format = "fp8", .page_entries = 16, .num_layers = 1, .pages = 64}}));
  auto info = d.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->groups_size(), 2);
  EXPECT_EQ(info->groups(0).fp8_variant(), "e4m3fnuz");
  EXPECT_EQ(info->groups(1).fp8_variant(), "e4m3fn");
  EXPECT_THAT(info->features(), ::testing::Contains("fp8_e4m3fnuz"));

  std::vector<TestLayer> fn_layers = d.layers();
  for (TestLayer& t : fn_layers) t.layout.fp8 = Fp8Variant::kE4m3fn;
  Shadow shadow(fn_layers, 5);
  for (const std::vector<SeqStep>& seqs :
       std::vector<std::vector<SeqStep>>{{{"a", 50}, {"b", 20}}, {{"a", 1}, {"b", 1}}}) {
    auto step = d.client().OpenStep(Header(seqs, shadow));
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<LayerData> data = shadow.Make(seqs);
    for (size_t li = 0; li < fn_layers.size(); ++li) {
      const TestLayer& t = fn_layers[li];
      const int64_t D = t.layout.head_dim, H = t.num_heads;
      v1::LayerRequest r;
      r.set_layer(static_cast<uint32_t>(t.layer));
      *r.mutable_k() = client::MakeByteTensor(v1::UINT8, data[li].k_quant,
                                              {data[li].n_new, t.layout.entry_bytes()});
      r.set_k_fp8(v1::FP8_E4M3);
      *r.mutable_q() = client::MakeByteTensor(v1::FP8_E4M3, data[li].q_codes, {data[li].rows, H, D});
      *r.mutable_weights() = client::MakeFp32Tensor(data[li].w_folded, {data[li].rows, H});
      auto reply = (*step)->RunLayer(r);
      ASSERT_TRUE(reply.ok()) << "layer " << t.layer << ": " << reply.status();
      auto topk = client::ReadInt32Tensor(reply->topk(), {data[li].rows, t.topk}, "topk");
      ASSERT_TRUE(topk.ok()) << topk.status();
      shadow.Check(li, seqs, data[li], topk->data());
    }
    ASSERT_TRUE((*step)->Commit().ok());
    shadow.Commit(seqs, data);
  }

  // e4m3fnuz codes with its NaN (0x80) in an import: refused, naming it.
  v1::WriteEntriesRequest w;
  *w.mutable_id() = client::NamedSequenceId("c");
  w.set_create(true);
  w.set_num_tokens(1);
  for (const TestLayer& t : d.layers()) {
    std::vector<uint8_t> entry(t.layout.entry_bytes(), 0x38);
    const float s = 1.0f;
    std::memcpy(entry.data() + t.layout.value_bytes(), &s, 4);
    entry[7] = 0x80;
    v1::LayerEntries* le = w.add_layers();
    le->set_layer(static_cast<uint32_t>(t.layer));
    *le->mutable_k() = client::MakeByteTensor(v1::UINT8, entry, {1, t.layout.entry_bytes()});
    le->set_k_fp8(v1::FP8_E4M3FNUZ);
  }
  auto len = d.client().WriteEntries(w);
  ASSERT_FALSE(len.ok());
  EXPECT_EQ(len.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(len.status().message()), HasSubstr("value 7 is an e4m3fnuz NaN code"));
}

}  // namespace
}  // namespace indexer::testing
