#include "server/rpc/step_wire.h"

#include <climits>
#include <cstring>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"

namespace indexer {
namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::io::CodedOutputStream;
using google::protobuf::io::StringOutputStream;
using google::protobuf::internal::WireFormatLite;

// The request's slices as one input stream, without copying them.
class ChunkStream final : public google::protobuf::io::ZeroCopyInputStream {
 public:
  explicit ChunkStream(absl::Span<const absl::string_view> chunks) : chunks_(chunks) {}

  bool Next(const void** data, int* size) override {
    while (i_ < chunks_.size()) {
      const absl::string_view c = chunks_[i_];
      if (at_ < c.size()) {
        const size_t n = std::min<size_t>(c.size() - at_, INT_MAX);
        *data = c.data() + at_;
        *size = static_cast<int>(n);
        at_ += n;
        total_ += static_cast<int64_t>(n);
        last_ = n;
        return true;
      }
      ++i_;
      at_ = 0;
    }
    last_ = 0;
    return false;
  }
  void BackUp(int count) override {
    // REQUIRES (ZeroCopyInputStream): count <= the last Next's size.
    at_ -= static_cast<size_t>(count);
    total_ -= count;
    last_ = 0;
  }
  bool Skip(int count) override {
    const void* d;
    int n;
    while (count > 0) {
      if (!Next(&d, &n)) return false;
      if (n > count) {
        BackUp(n - count);
        return true;
      }
      count -= n;
    }
    return true;
  }
  int64_t ByteCount() const override { return total_; }

 private:
  absl::Span<const absl::string_view> chunks_;
  size_t i_ = 0;
  size_t at_ = 0;
  size_t last_ = 0;
  int64_t total_ = 0;
};

constexpr uint32_t LenTag(int field) {
  return static_cast<uint32_t>(field) << 3 | WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

bool IsGroup(uint32_t tag) {
  const auto t = WireFormatLite::GetTagWireType(tag);
  return t == WireFormatLite::WIRETYPE_START_GROUP || t == WireFormatLite::WIRETYPE_END_GROUP;
}

// Protobuf's generated parser takes tags and length prefixes of at most 5
// bytes and fails the message on a longer one; CodedInputStream reads up
// to 10 and truncates. The skeleton declines those (protobuf then gives its
// verdict): true when the last read took at most 5 bytes from `at`.
bool Short(const CodedInputStream& in, int at) { return in.CurrentPosition() - at <= 5; }

// Reads a length prefix and limits `in` to it. False on a bad or too long one.
bool Enter(CodedInputStream* in, CodedInputStream::Limit* limit) {
  uint32_t len = 0;
  const int at = in->CurrentPosition();
  if (!in->ReadVarint32(&len) || !Short(*in, at) || len > INT_MAX) return false;
  // ReadSkeleton limits the whole request, so BytesUntilLimit is >= 0.
  if (static_cast<int>(len) > in->BytesUntilLimit()) return false;
  *limit = in->PushLimit(static_cast<int>(len));
  return true;
}

// Reads the fields of one message up to the current limit: `take(tag)`
// handles a field it wants (true = read, false = decline the whole
// request); all others are copied as they are into `rest`, which the
// generated parser then reads. False on anything unusual.
template <typename Take>
bool ReadFields(CodedInputStream* in, std::string* rest, Take take) {
  {
    StringOutputStream sos(rest);
    CodedOutputStream out(&sos);
    for (;;) {
      const int at = in->CurrentPosition();
      const uint32_t tag = in->ReadTag();
      if (!Short(*in, at)) return false;
      if (tag == 0) break;
      int handled = take(tag);  // 1 read, 0 not its field, -1 decline
      if (handled < 0) return false;
      if (handled > 0) continue;
      if (IsGroup(tag)) return false;
      if (!WireFormatLite::SkipField(in, tag, &out)) return false;
    }
    if (out.HadError()) return false;
  }
  return in->ConsumedEntireMessage();
}

// One Tensor: its data as a span, the rest parsed into `meta`.
bool ReadTensor(CodedInputStream* in, v1::Tensor* meta, WireSpan* span) {
  bool seen_data = false;
  std::string rest;
  const bool ok = ReadFields(in, &rest, [&](uint32_t tag) -> int {
    if (tag != LenTag(3)) return 0;  // Tensor.data
    if (seen_data) return -1;        // the last one wins: left to the parser
    seen_data = true;
    uint32_t len = 0;
    const int at = in->CurrentPosition();
    if (!in->ReadVarint32(&len) || !Short(*in, at) || len > INT_MAX) return -1;
    span->offset = static_cast<size_t>(in->CurrentPosition());
    span->length = len;
    return in->Skip(static_cast<int>(len)) ? 1 : -1;
  });
  if (!ok || !meta->ParseFromString(rest)) return false;
  // Data beside a reference is an error the normal path reports.
  return !(span->length > 0 && meta->has_ref());
}

bool ReadLayer(CodedInputStream* in, v1::LayerRequest* layer, StepWire* w) {
  struct Slot {
    v1::Tensor meta;
    bool seen = false;
  } slots[4];
  WireSpan* spans[4] = {&w->k, &w->q, &w->q_scale, &w->weights};
  std::string rest;
  const bool ok = ReadFields(in, &rest, [&](uint32_t tag) -> int {
    // LayerRequest fields k = 2, q = 3, q_scale = 4, weights = 5.
    const int field = static_cast<int>(WireFormatLite::GetTagFieldNumber(tag));
    if (field < 2 || field > 5) return 0;
    if (tag != LenTag(field)) return 0;  // a wrong wire type: the parser's verdict
    Slot& s = slots[field - 2];
    if (s.seen) return -1;  // repeated messages merge: left to the parser
    s.seen = true;
    CodedInputStream::Limit limit;
    if (!Enter(in, &limit)) return -1;
    if (!ReadTensor(in, &s.meta, spans[field - 2])) return -1;
    in->PopLimit(limit);
    return 1;
  });
  if (!ok || !layer->ParseFromString(rest)) return false;
  if (slots[0].seen) *layer->mutable_k() = std::move(slots[0].meta);
  if (slots[1].seen) *layer->mutable_q() = std::move(slots[1].meta);
  if (slots[2].seen) *layer->mutable_q_scale() = std::move(slots[2].meta);
  if (slots[3].seen) *layer->mutable_weights() = std::move(slots[3].meta);
  return true;
}

// A StepRequest of exactly one `layer` field (2), read by the skeleton.
bool ReadSkeleton(absl::Span<const absl::string_view> chunks, StepWire* w) {
  size_t total = 0;
  for (absl::string_view c : chunks) total += c.size();
  if (total > INT_MAX) return false;
  ChunkStream stream(chunks);
  CodedInputStream in(&stream);
  in.PushLimit(static_cast<int>(total));
  if (in.ReadTag() != LenTag(2) || !Short(in, 0)) return false;
  CodedInputStream::Limit limit;
  if (!Enter(&in, &limit)) return false;
  if (!ReadLayer(&in, w->msg.mutable_layer(), w)) return false;
  in.PopLimit(limit);
  // Nothing after it (a second layer would merge, a header would replace it).
  const int at = in.CurrentPosition();
  return in.ReadTag() == 0 && Short(in, at) && in.ConsumedEntireMessage();
}

}  // namespace

absl::Status ReadStepRequest(absl::Span<const absl::string_view> chunks, StepWire* out) {
  out->msg.Clear();
  out->k = out->q = out->q_scale = out->weights = WireSpan{};
  out->skeleton = ReadSkeleton(chunks, out);
  if (out->skeleton) return absl::OkStatus();
  out->msg.Clear();
  out->k = out->q = out->q_scale = out->weights = WireSpan{};
  ChunkStream stream(chunks);
  if (out->msg.ParseFromZeroCopyStream(&stream)) return absl::OkStatus();
  return absl::InvalidArgumentError("request: expected a StepRequest message");
}

void CopySpan(absl::Span<const absl::string_view> chunks, WireSpan span, uint8_t* dst) {
  size_t at = 0;  // offset of the chunk's first byte
  for (const absl::string_view c : chunks) {
    if (span.length == 0) return;
    if (span.offset < at + c.size()) {
      const size_t from = span.offset - at;
      const size_t n = std::min(c.size() - from, span.length);
      std::memcpy(dst, c.data() + from, n);
      dst += n;
      span.offset += n;
      span.length -= n;
    }
    at += c.size();
  }
}

v1::StepRequest Materialize(absl::Span<const absl::string_view> chunks, const StepWire& w) {
  v1::StepRequest m = w.msg;
  if (!w.skeleton) return m;
  v1::LayerRequest* l = m.mutable_layer();
  auto fill = [&](WireSpan s, v1::Tensor* (v1::LayerRequest::*field)()) {
    if (s.length == 0) return;
    std::string* d = (l->*field)()->mutable_data();
    d->resize(s.length);
    CopySpan(chunks, s, reinterpret_cast<uint8_t*>(d->data()));
  };
  fill(w.k, &v1::LayerRequest::mutable_k);
  fill(w.q, &v1::LayerRequest::mutable_q);
  fill(w.q_scale, &v1::LayerRequest::mutable_q_scale);
  fill(w.weights, &v1::LayerRequest::mutable_weights);
  return m;
}

}  // namespace indexer
