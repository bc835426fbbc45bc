// StepSession against a stand-in daemon that never answers: Abort gives up
// after ClientOptions::abort_grace by cancelling the stream, and a layer's
// round trip fails with the daemon's status when it ends the stream.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "indexer/client.h"

namespace indexer::client {
namespace {

// Reads every message of a Step stream and answers none. With
// `fail_after_first` it ends the stream with FAILED_PRECONDITION once the
// second message (the first layer) has arrived.
class SilentReactor : public grpc::ServerGenericBidiReactor {
 public:
  SilentReactor(std::atomic<int>* cancelled, bool fail_after_first)
      : cancelled_(cancelled), fail_after_first_(fail_after_first) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // half-closed: keep the stream open, answer nothing
    if (fail_after_first_ && ++reads_ == 2) {
      Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "stand-in says no"));
      return;
    }
    StartRead(&request_);
  }
  void OnCancel() override {
    ++*cancelled_;
    Finish(grpc::Status::CANCELLED);
  }
  void OnDone() override { delete this; }

 private:
  std::atomic<int>* cancelled_;
  bool fail_after_first_;
  int reads_ = 0;
  grpc::ByteBuffer request_;
};

class SilentService : public grpc::CallbackGenericService {
 public:
  explicit SilentService(bool fail_after_first) : fail_after_first_(fail_after_first) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    EXPECT_EQ(ctx->method(), "/indexer.v1.Indexer/Step");
    return new SilentReactor(&cancelled, fail_after_first_);
  }
  std::atomic<int> cancelled{0};

 private:
  bool fail_after_first_;
};

struct StandIn {
  explicit StandIn(bool fail_after_first) : service(fail_after_first) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterCallbackGenericService(&service);
    server = builder.BuildAndStart();
  }
  ~StandIn() { server->Shutdown(); }
  SilentService service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

v1::StepHeader OneSequence() {
  v1::StepHeader header;
  v1::StepSequence* s = header.add_sequences();
  *s->mutable_id() = NumericSequenceId(1);
  s->set_q_len(1);
  return header;
}

TEST(StepSessionTest, AbortCancelsAfterTheGrace) {
  StandIn daemon(false);
  ASSERT_NE(daemon.server, nullptr);
  ClientOptions options;
  options.abort_grace = absl::Milliseconds(200);
  auto client = IndexerClient::Connect("127.0.0.1:" + std::to_string(daemon.port), options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->OpenStep(OneSequence());
  ASSERT_TRUE(session.ok()) << session.status();
  const auto start = std::chrono::steady_clock::now();
  (*session)->Abort();
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE((*session)->finished());
  EXPECT_GE(ms, 150.0);
  EXPECT_LT(ms, 5000.0);
  for (int i = 0; i < 200 && daemon.service.cancelled == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(daemon.service.cancelled, 1);
  // A finished session refuses further calls.
  EXPECT_EQ((*session)->RunLayer(v1::LayerRequest()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StepSessionTest, LayerFailsWithTheDaemonsStatus) {
  StandIn daemon(true);
  ASSERT_NE(daemon.server, nullptr);
  auto client = IndexerClient::Connect("127.0.0.1:" + std::to_string(daemon.port));
  ASSERT_TRUE(client.ok()) << client.status();
  auto session = (*client)->OpenStep(OneSequence());
  ASSERT_TRUE(session.ok()) << session.status();
  v1::LayerRequest request;
  request.set_layer(0);
  *request.mutable_q() = MakeByteTensor(v1::FP8_E4M3, std::vector<uint8_t>(65536, 1), {4, 128, 128});
  auto reply = (*session)->RunLayer(std::move(request));
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kFailedPrecondition) << reply.status();
  EXPECT_EQ(reply.status().message(), "stand-in says no");
  EXPECT_TRUE((*session)->finished());
}

}  // namespace
}  // namespace indexer::client
