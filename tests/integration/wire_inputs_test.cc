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

}  // namespace
}  // namespace indexer::testing
