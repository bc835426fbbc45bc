// Errors and logs an operator or a client can act on (issue 13):
// INVALID_ARGUMENT statuses carry a google.rpc.BadRequest naming the field
// beside the message, as the client library hands them on; the JSON log
// format writes one valid JSON object per line; every call's access line
// has the request id and the caller's traceparent.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "gtest/gtest.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/log_format.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/spdlog.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;

// The BadRequest a client status carries; fails the test when absent.
google::rpc::BadRequest BadRequestOf(const absl::Status& s) {
  google::rpc::BadRequest bad;
  auto payload = s.GetPayload(client::kStatusDetailsUrl);
  EXPECT_TRUE(payload.has_value()) << "no status details: " << s;
  if (!payload) return bad;
  google::rpc::Status details;
  EXPECT_TRUE(details.ParseFromString(std::string(*payload)));
  EXPECT_EQ(details.code(), static_cast<int>(s.code()));
  EXPECT_EQ(details.message(), std::string(s.message()));
  EXPECT_EQ(details.details_size(), 1);
  if (details.details_size() == 1) EXPECT_TRUE(details.details(0).UnpackTo(&bad));
  return bad;
}

TEST(FieldOfMessage, NamesTheRequestPath) {
  EXPECT_EQ(FieldOfMessage("layer 0: q: expected [12, 64, 128] FP8_E4M3 (98304 bytes), got x"),
            "layer.q");
  EXPECT_EQ(FieldOfMessage("header.sequences[3].q_len: expected 1..4096, got 0"),
            "header.sequences[3].q_len");
  EXPECT_EQ(FieldOfMessage("layers[2].k: expected UINT8 [4, 132], got [4, 128]"), "layers[2].k");
  EXPECT_EQ(FieldOfMessage("layer 7: step: expected ..."), "layer.step");
  // Not a field: the whole request, prose, a sequence's display name.
  EXPECT_EQ(FieldOfMessage("request: expected a StepRequest message; 3 bytes do not decode"), "");
  EXPECT_EQ(FieldOfMessage("admission: 4 steps open; max_open_steps = 4"), "admission");
  EXPECT_EQ(FieldOfMessage("sequence \"a\": not found"), "");
  EXPECT_EQ(FieldOfMessage("no colon here"), "");
  EXPECT_EQ(FieldOfMessage("a[: x"), "");
  EXPECT_EQ(FieldOfMessage("9lives: x"), "");
}

TEST(ToGrpcStatus, DetailsOnlyForFieldErrors) {
  const grpc::Status bad = ToGrpcStatus(absl::InvalidArgumentError("weights: expected FP32"));
  google::rpc::Status details;
  ASSERT_TRUE(details.ParseFromString(bad.error_details()));
  google::rpc::BadRequest br;
  ASSERT_TRUE(details.details(0).UnpackTo(&br));
  EXPECT_EQ(br.field_violations(0).field(), "weights");
  EXPECT_EQ(br.field_violations(0).description(), "weights: expected FP32");
  EXPECT_EQ(bad.error_message(), "weights: expected FP32");
  EXPECT_TRUE(ToGrpcStatus(absl::NotFoundError("x: unknown")).error_details().empty());
  EXPECT_TRUE(ToGrpcStatus(absl::InvalidArgumentError("prose only")).error_details().empty());
}

// A sink that keeps the formatted lines (the daemon's formatter applies).
class Capture : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> Lines() {
    std::lock_guard<std::mutex> lock(text_mu_);
    return absl::StrSplit(text_, '\n', absl::SkipEmpty());
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::lock_guard<std::mutex> lock(text_mu_);
    text_.append(buf.data(), buf.size());
  }
  void flush_() override {}

 private:
  std::mutex text_mu_;
  std::string text_;
};

// Installs a capturing default logger in the given format for its scope.
struct ScopedCapture {
  explicit ScopedCapture(const std::string& format) {
    previous = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("debuggability_test", sink));
    EXPECT_TRUE(SetLogFormat(format).ok());
  }
  ~ScopedCapture() {
    spdlog::set_default_logger(previous);
    EXPECT_TRUE(SetLogFormat("text").ok());
  }
  std::shared_ptr<Capture> sink = std::make_shared<Capture>();
  std::shared_ptr<spdlog::logger> previous;
};

google::protobuf::Struct ParseJson(const std::string& line) {
  google::protobuf::Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &s).ok()) << line;
  return s;
}

std::string Field(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? "<absent>" : it->second.string_value();
}

class Debuggability : public ::testing::Test {
 protected:
  Debuggability()
      : daemon_(MakeConfig({{.format = "fp8", .num_layers = 2, .heads = 4, .pages = 32}})),
        shadow_(daemon_.layers(), 5) {}

  std::unique_ptr<IndexerClient> TracedClient(const std::string& traceparent,
                                              const std::string& request_id) {
    client::ClientOptions o;
    o.metadata = {{"traceparent", traceparent}, {"x-request-id", request_id}};
    auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(daemon_.port()), o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  Daemon daemon_;
  Shadow shadow_;
};

TEST_F(Debuggability, BadRequestNamesTheField) {
  // A Step layer whose Q has the wrong shape.
  auto step = daemon_.client().OpenStep(Header({{"s", 3}}, shadow_));
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<LayerData> data = shadow_.Make({{"s", 3}});
  v1::LayerRequest r = Request(daemon_.layers()[0], data[0], Form::kFloat);
  r.mutable_q()->set_shape(0, 2);
  absl::Status s = (*step)->RunLayer(r).status();
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("layer 0: q: expected"));
  google::rpc::BadRequest bad = BadRequestOf(s);
  ASSERT_EQ(bad.field_violations_size(), 1);
  EXPECT_EQ(bad.field_violations(0).field(), "layer.q");
  EXPECT_EQ(bad.field_violations(0).description(), std::string(s.message()));

  // A WriteEntries without a layer's entries, and a header with q_len 0.
  v1::WriteEntriesRequest w;
  *w.mutable_id() = client::NamedSequenceId("w");
  w.set_create(true);
  w.set_num_tokens(2);
  absl::Status ws = daemon_.client().WriteEntries(w).status();
  ASSERT_EQ(ws.code(), absl::StatusCode::kInvalidArgument) << ws;
  EXPECT_EQ(BadRequestOf(ws).field_violations(0).field(), std::string(ws.message()).substr(
                                                              0, ws.message().find(':')));
  v1::StepHeader h = Header({{"z", 1}}, shadow_);
  h.mutable_sequences(0)->set_q_len(0);
  auto zero = daemon_.client().OpenStep(h);
  absl::Status hs = zero.ok() ? (*zero)->RunLayer(v1::LayerRequest()).status() : zero.status();
  ASSERT_EQ(hs.code(), absl::StatusCode::kInvalidArgument) << hs;
  EXPECT_EQ(BadRequestOf(hs).field_violations(0).field(), "header.sequences[0].q_len") << hs;
}

TEST_F(Debuggability, JsonLinesCarryRequestIdAndTraceparent) {
  const std::string tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  ScopedCapture capture("json");
  auto traced = TracedClient(tp, "req-42");
  ASSERT_TRUE(traced->GetServerInfo().ok());
  // A committed step: its line has the step's own id (StepHeader.request_id).
  v1::StepHeader h = Header({{"t", 2}}, shadow_);
  h.set_request_id("step-id-\"7\"");  // quotes are escaped in the line
  {
    auto step = traced->OpenStep(h);
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<LayerData> data = shadow_.Make({{"t", 2}});
    for (size_t li = 0; li < daemon_.layers().size(); ++li) {
      ASSERT_TRUE((*step)->RunLayer(Request(daemon_.layers()[li], data[li], Form::kFloat)).ok());
    }
    ASSERT_TRUE((*step)->Commit().ok());
  }
  daemon_.WaitIdle();
  bool saw_info = false, saw_step = false;
  for (const std::string& line : capture.sink->Lines()) {
    const google::protobuf::Struct j = ParseJson(line);
    EXPECT_NE(Field(j, "time"), "<absent>") << line;
    EXPECT_NE(Field(j, "level"), "<absent>") << line;
    if (Field(j, "msg") != "call") continue;
    EXPECT_EQ(Field(j, "level"), "info") << line;
    EXPECT_EQ(Field(j, "traceparent"), tp) << line;
    if (Field(j, "method") == "/indexer.v1.Indexer/GetServerInfo") {
      saw_info = true;
      EXPECT_EQ(Field(j, "request_id"), "req-42") << line;
      EXPECT_EQ(Field(j, "code"), "OK") << line;
    }
    if (Field(j, "method") == "/indexer.v1.Indexer/Step") {
      saw_step = true;
      EXPECT_EQ(Field(j, "request_id"), "step-id-\\\"7\\\"") << line;  // LogSafe-escaped
      EXPECT_EQ(Field(j, "code"), "OK") << line;
    }
  }
  EXPECT_TRUE(saw_info);
  EXPECT_TRUE(saw_step);
}

TEST_F(Debuggability, TextLinesCarryTraceparentToo) {
  ScopedCapture capture("text");
  auto traced = TracedClient("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "r1");
  ASSERT_FALSE(traced->Release({client::NamedSequenceId("nope")}).ok());
  bool saw = false;
  for (const std::string& line : capture.sink->Lines()) {
    if (line.find("call /indexer.v1.Indexer/Release") == std::string::npos) continue;
    saw = true;
    EXPECT_THAT(line, HasSubstr("request_id=r1"));
    EXPECT_THAT(line, HasSubstr("traceparent=00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"));
    EXPECT_THAT(line, HasSubstr("NOT_FOUND"));
  }
  EXPECT_TRUE(saw);
}

TEST(LogFormat, RejectsUnknownFormats) {
  absl::Status s = SetLogFormat("xml");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--log-format"));
  EXPECT_EQ(JsonEscape("a\"b\\c\nd\x01"), "a\\\"b\\\\c\\nd\\u0001");
}

}  // namespace
}  // namespace indexer::testing
