// The skeleton reader of StepRequest bytes (server/rpc/step_wire.h) against
// the generated parser that the Step handler used before it: every request
// shape the service takes, split into slices as gRPC and the client library
// split them, reads to the same message; malformed bytes give the same
// error.
#include "server/rpc/step_wire.h"

#include <random>
#include <string>
#include <vector>

#include "client/request_wire.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "gtest/gtest.h"

namespace indexer {
namespace {

std::vector<absl::string_view> Views(const std::vector<std::string>& parts) {
  return {parts.begin(), parts.end()};
}

// The old path: gRPC's deserialization of the received buffer.
bool OldParse(const std::vector<std::string>& parts, v1::StepRequest* out) {
  std::vector<grpc::Slice> slices;
  for (const std::string& p : parts) slices.emplace_back(p);
  grpc::ByteBuffer bb(slices.data(), slices.size());
  return grpc::SerializationTraits<v1::StepRequest>::Deserialize(&bb, out).ok();
}

// Checks that the reader agrees with the old path on `parts`; returns
// whether the skeleton (not the fallback) read it.
bool Agrees(const std::vector<std::string>& parts, const std::string& what) {
  v1::StepRequest want;
  const bool want_ok = OldParse(parts, &want);
  StepWire w;
  const std::vector<absl::string_view> views = Views(parts);
  const absl::Status got = ReadStepRequest(views, &w);
  EXPECT_EQ(got.ok(), want_ok) << what << ": " << got;
  if (!want_ok) {
    EXPECT_EQ(got, absl::InvalidArgumentError("request: expected a StepRequest message")) << what;
    return w.skeleton;
  }
  const v1::StepRequest have = Materialize(views, w);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(have, want))
      << what << "\n got:  " << have.ShortDebugString().substr(0, 400)
      << "\n want: " << want.ShortDebugString().substr(0, 400);
  EXPECT_EQ(have.SerializeAsString(), want.SerializeAsString()) << what;
  return w.skeleton;
}

// `bytes` cut at `cuts` (sorted offsets).
std::vector<std::string> Split(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<std::string> parts;
  size_t at = 0;
  for (size_t c : cuts) {
    if (c <= at || c >= bytes.size()) continue;
    parts.push_back(bytes.substr(at, c - at));
    at = c;
  }
  parts.push_back(bytes.substr(at));
  return parts;
}

v1::Tensor Make(v1::DataType dt, std::vector<int64_t> shape, size_t bytes, uint8_t seed) {
  v1::Tensor t;
  t.set_dtype(dt);
  for (int64_t d : shape) t.add_shape(d);
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(seed + i * 31);
  t.set_data(data);
  return t;
}

// The layer shapes of the service: dense FP8 Q + weights with new K, MXFP4
// Q + scales, FP32 block Q, references, an output reference, empty tensors.
std::vector<v1::LayerRequest> Layers() {
  std::vector<v1::LayerRequest> out;
  v1::LayerRequest dense;
  dense.set_layer(3);
  *dense.mutable_k() = Make(v1::UINT8, {5, 132}, 5 * 132, 1);
  *dense.mutable_q() = Make(v1::FP8_E4M3, {5, 64, 128}, 5 * 64 * 128, 2);
  *dense.mutable_weights() = Make(v1::FP32, {5, 64}, 5 * 64 * 4, 3);
  out.push_back(dense);
  v1::LayerRequest fp8k = dense;
  fp8k.set_k_fp8(v1::FP8_E4M3FNUZ);
  out.push_back(fp8k);
  v1::LayerRequest mx;
  mx.set_layer(0);
  *mx.mutable_q() = Make(v1::UINT8, {2, 8, 64}, 2 * 8 * 64, 4);
  *mx.mutable_q_scale() = Make(v1::UINT8, {2, 8, 4}, 2 * 8 * 4, 5);
  *mx.mutable_weights() = Make(v1::FP32, {2, 8}, 2 * 8 * 4, 6);
  *mx.mutable_k() = Make(v1::BF16, {1, 128}, 256, 7);
  out.push_back(mx);
  v1::LayerRequest block;
  block.set_layer(60);
  *block.mutable_q() = Make(v1::FP32, {1, 4, 128}, 4 * 128 * 4, 8);
  out.push_back(block);
  v1::LayerRequest refs;
  refs.set_layer(1);
  refs.mutable_q()->set_dtype(v1::FP8_E4M3);
  refs.mutable_q()->add_shape(1);
  refs.mutable_q()->mutable_ref()->set_region(7);
  refs.mutable_q()->mutable_ref()->set_bytes(8192);
  refs.mutable_weights()->mutable_ref()->set_region(7);
  refs.mutable_weights()->mutable_ref()->set_offset(8192);
  refs.mutable_topk_out()->set_region(9);
  refs.mutable_topk_out()->set_bytes(8192);
  out.push_back(refs);
  v1::LayerRequest mixed = dense;  // inline q, referenced weights, output ref
  mixed.mutable_weights()->clear_data();
  mixed.mutable_weights()->mutable_ref()->set_region(2);
  mixed.mutable_topk_out()->set_region(3);
  out.push_back(mixed);
  v1::LayerRequest empty;  // present but empty tensors; layer 0 (all default)
  empty.mutable_q();
  empty.mutable_weights()->set_dtype(v1::FP32);
  out.push_back(empty);
  out.push_back(v1::LayerRequest());  // an empty layer message
  return out;
}

std::string StepOf(const v1::LayerRequest& l) {
  v1::StepRequest r;
  *r.mutable_layer() = l;
  return r.SerializeAsString();
}

TEST(StepWireTest, LayersAsOneSliceReadByTheSkeleton) {
  for (const v1::LayerRequest& l : Layers()) {
    EXPECT_TRUE(Agrees({StepOf(l)}, l.ShortDebugString().substr(0, 200)));
  }
}

TEST(StepWireTest, LayersAsTheClientLibrarySlicesThem) {
  int encoded = 0;
  for (const v1::LayerRequest& l : Layers()) {
    for (size_t min_slice : {size_t{1}, size_t{64}, size_t{4096}}) {
      v1::LayerRequest copy = l;
      grpc::ByteBuffer bb;
      // The encoder leaves references to protobuf (the one-slice case above).
      if (!client::EncodeLayerStepRequest(&copy, &bb, min_slice)) continue;
      ++encoded;
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(bb.Dump(&slices).ok());
      std::vector<std::string> parts;
      for (const grpc::Slice& s : slices) parts.emplace_back(s.begin(), s.end());
      EXPECT_TRUE(Agrees(parts, absl::StrCat("layer ", l.layer(), " min_slice ", min_slice,
                                             ", ", parts.size(), " slices")));
    }
  }
  EXPECT_GE(encoded, 15);  // all but the two layers with references
}

TEST(StepWireTest, LayersCutAnywhere) {
  std::mt19937 rng(11);
  for (const v1::LayerRequest& l : Layers()) {
    const std::string bytes = StepOf(l);
    // Every single cut in the first 64 bytes (tags, lengths), then random ones.
    for (size_t c = 1; c < std::min<size_t>(bytes.size(), 64); ++c) {
      Agrees(Split(bytes, {c}), absl::StrCat("cut at ", c));
    }
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<size_t> cuts;
      for (int i = 0; i < 6; ++i) cuts.push_back(rng() % (bytes.size() + 1));
      std::sort(cuts.begin(), cuts.end());
      EXPECT_TRUE(Agrees(Split(bytes, cuts), absl::StrCat("trial ", trial)));
    }
  }
}

TEST(StepWireTest, HeaderAndCommitTakeTheGeneratedParser) {
  v1::StepRequest h;
  v1::StepSequence* s = h.mutable_header()->add_sequences();
  s->mutable_id()->set_name("seq-a");
  s->set_q_len(3);
  s->set_create(true);
  h.mutable_header()->add_sequences()->mutable_id()->set_num(42);
  h.mutable_header()->set_request_id("r1");
  EXPECT_FALSE(Agrees({h.SerializeAsString()}, "header"));
  v1::StepRequest c;
  c.mutable_commit();
  EXPECT_FALSE(Agrees({c.SerializeAsString()}, "commit"));
  EXPECT_FALSE(Agrees({std::string()}, "no field at all"));
  EXPECT_FALSE(Agrees({}, "no slices"));
}

// Shapes the skeleton declines but protobuf accepts: same result through the
// fallback.
TEST(StepWireTest, UnusualButValidRequestsFallBackToTheSameMessage) {
  const v1::LayerRequest dense = Layers()[0];
  const std::string one = StepOf(dense);
  // Two layer fields merge; a header after a layer replaces it (oneof).
  EXPECT_FALSE(Agrees({one + one}, "layer twice"));
  v1::StepRequest c;
  c.mutable_commit();
  EXPECT_FALSE(Agrees({one + c.SerializeAsString()}, "layer then commit"));
  // A tensor given twice in one layer (its fields merge, the last data wins).
  v1::LayerRequest q2;
  *q2.mutable_q() = Make(v1::FP8_E4M3, {1}, 16, 9);
  {
    v1::LayerRequest a = dense, b = q2;
    std::string body = a.SerializeAsString() + b.SerializeAsString();
    std::string bytes;
    bytes.push_back(0x12);  // StepRequest.layer
    uint64_t n = body.size();
    while (n >= 0x80) { bytes.push_back(static_cast<char>(n | 0x80)); n >>= 7; }
    bytes.push_back(static_cast<char>(n));
    EXPECT_FALSE(Agrees({bytes + body}, "q twice"));
  }
  // Data beside a reference: parsed (the handler then names the field).
  v1::LayerRequest both = dense;
  both.mutable_q()->mutable_ref()->set_region(4);
  EXPECT_FALSE(Agrees({StepOf(both)}, "data and ref"));
  // Unknown fields in the layer and in a tensor are kept.
  v1::LayerRequest unk = dense;
  unk.GetReflection()->MutableUnknownFields(&unk)->AddVarint(99, 5);
  unk.mutable_q()->GetReflection()->MutableUnknownFields(unk.mutable_q())->AddLengthDelimited(
      77, "xyz");
  EXPECT_TRUE(Agrees({StepOf(unk)}, "unknown fields"));
  // An unknown group: left to the parser.
  v1::LayerRequest grp = dense;
  grp.GetReflection()->MutableUnknownFields(&grp)->AddGroup(50)->AddVarint(1, 2);
  EXPECT_FALSE(Agrees({StepOf(grp)}, "unknown group"));
}

TEST(StepWireTest, MalformedBytesGiveTheSameError) {
  const std::string good = StepOf(Layers()[2]);
  // Truncated at every length.
  for (size_t n = 1; n < good.size(); ++n) {
    Agrees({good.substr(0, n)}, absl::StrCat("truncated to ", n));
  }
  // Every byte of the first 48 replaced by a few bad values (tags of field
  // 0, wire types 6 and 7, huge lengths, continuation bits).
  for (size_t i = 0; i < std::min<size_t>(good.size(), 48); ++i) {
    for (int v : {0x00, 0x07, 0x0e, 0x0f, 0x7f, 0x80, 0xff, 0x12, 0x1a}) {
      std::string bad = good;
      bad[i] = static_cast<char>(v);
      Agrees({bad}, absl::StrCat("byte ", i, " = ", v));
      Agrees(Split(bad, {i, i + 1}), absl::StrCat("split, byte ", i, " = ", v));
    }
  }
  // A length past the end, and trailing garbage.
  std::string longer = good;
  longer[1] = static_cast<char>(static_cast<uint8_t>(longer[1]) + 1);
  Agrees({longer}, "length + 1");
  Agrees({good + "\x12"}, "a dangling tag");
  Agrees({good + std::string(1, '\0')}, "a zero tag");
  // Tags and lengths of more than 5 bytes: protobuf fails them, where
  // CodedInputStream would read and truncate (fuzz_step_wire's find).
  Agrees({std::string("\x12\x12\x12\x00\xc8\xc7\xc7\xe5\xc7\xc7\xc7\xc0\x38\xe4\x08\x08\x98\x00\x08\x08", 20)},
         "a 9-byte tag inside a layer");
  Agrees({std::string("\x92\x80\x80\x80\x80\x00\x00", 7)}, "a 6-byte top-level tag");
  Agrees({std::string("\x12\x80\x80\x80\x80\x80\x00", 7)}, "a 6-byte length");
}

TEST(StepWireTest, CopySpanCrossesSlices) {
  const std::vector<std::string> parts = {"abc", "", "defg", "h"};
  const std::vector<absl::string_view> views = Views(parts);
  std::string out(6, '?');
  CopySpan(views, WireSpan{1, 6}, reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_EQ(out, "bcdefg");
  CopySpan(views, WireSpan{7, 1}, reinterpret_cast<uint8_t*>(out.data()));
  EXPECT_EQ(out[0], 'h');
}

}  // namespace
}  // namespace indexer
