// EncodeLayerStepRequest writes exactly protobuf's bytes of
// StepRequest{layer: request}, with the large tensor data as slices of its own.
#include "client/request_wire.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "indexer/client.h"

namespace indexer::client {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer, size_t* num_slices) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  *num_slices = slices.size();
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

std::vector<uint8_t> Pattern(size_t n, int seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

std::vector<float> Floats(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.25f * static_cast<float>(i) - 3.0f;
  return v;
}

// Encodes `request` and checks the bytes against protobuf's serialization
// of the same StepRequest; returns the number of slices.
size_t ExpectSameBytes(const v1::LayerRequest& request) {
  v1::StepRequest message;
  *message.mutable_layer() = request;
  const std::string expected = message.SerializeAsString();
  v1::LayerRequest moved = request;
  grpc::ByteBuffer buffer;
  EXPECT_TRUE(EncodeLayerStepRequest(&moved, &buffer));
  size_t num_slices = 0;
  const std::string got = Flatten(buffer, &num_slices);
  EXPECT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected) << "encodings differ";
  v1::StepRequest parsed;
  EXPECT_TRUE(parsed.ParseFromString(got));
  EXPECT_EQ(parsed.SerializeAsString(), expected);
  return num_slices;
}

TEST(RequestWireTest, DecodeLayerMatchesProtobufAndSlicesLargeTensors) {
  v1::LayerRequest r;
  r.set_layer(7);
  *r.mutable_k() = MakeFp32Tensor(Floats(64 * 128), {64, 128});
  *r.mutable_q() = MakeByteTensor(v1::FP8_E4M3, Pattern(64 * 64 * 128, 3), {64, 64, 128});
  *r.mutable_weights() = MakeFp32Tensor(Floats(64 * 64), {64, 64});
  // head, K, between, Q, between, weights: three data slices.
  EXPECT_EQ(ExpectSameBytes(r), 6u);
}

TEST(RequestWireTest, SmallTensorsAreCopiedInline) {
  v1::LayerRequest r;
  r.set_layer(300);  // two-byte varint
  *r.mutable_k() = MakeByteTensor(v1::UINT8, Pattern(132, 1), {1, 132});
  *r.mutable_q() = MakeByteTensor(v1::UINT8, Pattern(64 * 32, 5), {1, 64, 32});
  *r.mutable_q_scale() = MakeByteTensor(v1::UINT8, Pattern(256, 9), {1, 64, 4});
  *r.mutable_weights() = MakeFp32Tensor(Floats(64), {1, 64});
  EXPECT_EQ(ExpectSameBytes(r), 1u);
}

TEST(RequestWireTest, DefaultsAndEmptyTensors) {
  v1::LayerRequest r;  // layer 0 is not on the wire
  *r.mutable_k() = MakeFp32Tensor({}, {0, 128});  // present, no data
  r.mutable_q_scale();                            // present, all defaults
  *r.mutable_q() = MakeByteTensor(v1::FP8_E4M3, Pattern(8192, 2), {1, 64, 128});
  // head (k, start of q), Q's data, q_scale.
  EXPECT_EQ(ExpectSameBytes(r), 3u);
  EXPECT_EQ(ExpectSameBytes(v1::LayerRequest()), 1u);
}

TEST(RequestWireTest, TopkOutIsWrittenLast) {
  v1::LayerRequest r;
  r.set_layer(3);
  *r.mutable_q() = MakeByteTensor(v1::FP8_E4M3, Pattern(8192, 4), {1, 64, 128});
  *r.mutable_weights() = MakeFp32Tensor(Floats(64), {1, 64});
  *r.mutable_topk_out() = MakeTensorRef(9, 4096, 2048 * 4);
  // head, Q's data, weights + topk_out.
  EXPECT_EQ(ExpectSameBytes(r), 3u);
}

TEST(RequestWireTest, KFp8IsWrittenAfterTopkOut) {
  v1::LayerRequest r;
  r.set_layer(2);
  *r.mutable_k() = MakeByteTensor(v1::UINT8, Pattern(132 * 40, 7), {40, 132});
  *r.mutable_q() = MakeByteTensor(v1::FP8_E4M3FNUZ, Pattern(8192, 4), {1, 64, 128});
  *r.mutable_weights() = MakeFp32Tensor(Floats(64), {1, 64});
  *r.mutable_topk_out() = MakeTensorRef(9, 4096, 2048 * 4);
  r.set_k_fp8(v1::FP8_E4M3FNUZ);
  // head, K's data, Q's head, Q's data, weights + topk_out + k_fp8.
  EXPECT_EQ(ExpectSameBytes(r), 5u);
  r.clear_topk_out();
  EXPECT_EQ(ExpectSameBytes(r), 5u);
}

TEST(RequestWireTest, ReferencesFallBackToProtobuf) {
  v1::LayerRequest r;
  *r.mutable_q() = MakeRefTensor(v1::FP8_E4M3, {1, 64, 128}, 5, 0);
  EXPECT_EQ(r.q().ref().bytes(), 64u * 128u);
  const std::string before = r.SerializeAsString();
  grpc::ByteBuffer buffer;
  EXPECT_FALSE(EncodeLayerStepRequest(&r, &buffer));
  EXPECT_EQ(r.SerializeAsString(), before);
}

TEST(RequestWireTest, UnknownFieldsFallBackUntouched) {
  v1::LayerRequest r;
  r.set_layer(1);
  *r.mutable_q() = MakeByteTensor(v1::FP8_E4M3, Pattern(8192, 4), {1, 64, 128});
  // Field 99 (varint 1) is not in LayerRequest: kept as an unknown field.
  std::string bytes = r.SerializeAsString();
  bytes += std::string("\x98\x06\x01", 3);
  v1::LayerRequest with_unknown;
  ASSERT_TRUE(with_unknown.ParseFromString(bytes));
  const std::string before = with_unknown.SerializeAsString();
  grpc::ByteBuffer buffer;
  EXPECT_FALSE(EncodeLayerStepRequest(&with_unknown, &buffer));
  EXPECT_EQ(with_unknown.SerializeAsString(), before);
}

}  // namespace
}  // namespace indexer::client
