// grpc_echo_bench: the ceiling for the daemon's per-layer service latency
// (SPEC §8): a bare gRPC echo of the same bytes over loopback.
//
// An in-process callback generic server (no protobuf, no handler work) on
// 127.0.0.1:0 answers each message of one bidi stream with a reply of the
// size the message asks for; the client sends --request-bytes and waits for
// --reply-bytes, one round trip at a time on one stream, as `indexer-cli
// bench` does with one LayerRequest / LayerReply of a Step stream. Prints
// the round trip p50/p99 (and min, mean, max) over --iters.
//
// The same run then measures a small message (--small-bytes each way,
// default 200: a small control message such as a layer request that
// carries references), the floor of any gRPC call on the machine (SPEC §8,
// issue 10's targets).
//
// Defaults: one 64-row decode layer of the deepseek-v3.2-fp8 shape (H 64,
// D 128, top-k 2048), without the protobuf framing (< 100 B):
//   request = Q [64, 64, 128] FP8 (524288 B) + weights [64, 64] FP32
//             (16384 B) + K [64, 128] FP32 (32768 B) = 573440 B
//   reply   = top-k [64, 2048] INT32 = 524288 B
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <sys/resource.h>

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "proto/transport_tuning.h"

namespace {

constexpr char kMethod[] = "/indexer.bench.Echo/Bidi";
// Every request starts with the reply size it asks for (little-endian).
constexpr size_t kHeaderBytes = sizeof(uint64_t);

// Copies the first `n` bytes of `buffer` (over slice boundaries) to `out`;
// false when the buffer is shorter.
bool CopyPrefix(const grpc::ByteBuffer& buffer, size_t n, uint8_t* out) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  size_t done = 0;
  for (const grpc::Slice& s : slices) {
    const size_t take = std::min(n - done, s.size());
    std::memcpy(out + done, s.begin(), take);
    done += take;
    if (done == n) return true;
  }
  return false;
}

// ------------------------------------------------------------------ server --

// One stream: read a message, reply with as many bytes as it asks for
// (copied from `pattern` into a fresh slice, as the daemon serializes a
// fresh top-k), read the next one; finish when the client closes.
class EchoReactor : public grpc::ServerGenericBidiReactor {
 public:
  explicit EchoReactor(const std::vector<uint8_t>* pattern)
      : pattern_(pattern) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    uint64_t want = 0;
    uint8_t header[kHeaderBytes];
    if (!CopyPrefix(request_, kHeaderBytes, header)) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "request: expected >= 8 bytes"));
      return;
    }
    std::memcpy(&want, header, kHeaderBytes);
    if (want > pattern_->size()) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "reply size: expected <= the server's pattern"));
      return;
    }
    grpc::Slice slice(pattern_->data(), want);
    reply_ = grpc::ByteBuffer(&slice, 1);
    StartWrite(&reply_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  const std::vector<uint8_t>* pattern_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer reply_;
};

class EchoService : public grpc::CallbackGenericService {
 public:
  explicit EchoService(size_t max_reply) : pattern_(max_reply) {
    for (size_t i = 0; i < pattern_.size(); ++i) {
      pattern_[i] = static_cast<uint8_t>(i * 131 + 7);
    }
  }

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    if (ctx->method() != kMethod) {
      return grpc::CallbackGenericService::CreateReactor(ctx);
    }
    return new EchoReactor(&pattern_);
  }

 private:
  std::vector<uint8_t> pattern_;
};

// ------------------------------------------------------------------ client --

// One bidi stream driven from the calling thread through its own completion
// queue (the generic stub has no sync streaming call; this is what the sync
// API does underneath).
class EchoStream {
 public:
  explicit EchoStream(grpc::GenericStub* stub) {
    call_ = stub->PrepareCall(&context_, kMethod, &cq_);
    call_->StartCall(Tag(1));
    ok_ = Await(1);
  }

  ~EchoStream() {
    if (ok_) {
      call_->WritesDone(Tag(4));
      Await(4);
      grpc::Status status;
      call_->Finish(&status, Tag(5));
      Await(5);
      if (!status.ok()) {
        std::fprintf(stderr, "stream finished with %d: %s\n",
                     static_cast<int>(status.error_code()),
                     status.error_message().c_str());
      }
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // One round trip; false (with the reason on stderr) on failure.
  bool RoundTrip(const grpc::ByteBuffer& request, size_t reply_bytes) {
    if (!ok_) return false;
    call_->Write(request, Tag(2));
    grpc::ByteBuffer reply;
    call_->Read(&reply, Tag(3));
    // The write and the read complete in either order.
    for (int pending = 2; pending > 0; --pending) {
      void* tag;
      bool ok;
      if (!cq_.Next(&tag, &ok) || !ok) {
        std::fprintf(stderr, "round trip failed (tag %p)\n", tag);
        return ok_ = false;
      }
    }
    if (reply.Length() != reply_bytes) {
      std::fprintf(stderr, "reply: expected %zu bytes, got %zu\n",
                   reply_bytes, reply.Length());
      return ok_ = false;
    }
    return true;
  }

 private:
  static void* Tag(intptr_t i) { return reinterpret_cast<void*>(i); }
  bool Await(intptr_t want) {
    void* tag;
    bool ok;
    return cq_.Next(&tag, &ok) && tag == Tag(want) && ok;
  }

  grpc::ClientContext context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  bool ok_ = false;
};

// User + system CPU time of the whole process (client and server threads).
double ProcessCpuMicros() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto us = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) * 1e6 + static_cast<double>(tv.tv_usec);
  };
  return us(ru.ru_utime) + us(ru.ru_stime);
}

// The nearest-rank percentile, as indexer-cli bench reports it.
double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size());
  size_t i = rank <= 1 ? 0 : static_cast<size_t>(std::ceil(rank)) - 1;
  return values[std::min(i, values.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "grpc_echo_bench: loopback gRPC round trip of a bidi stream message "
      "(bare echo, no protobuf), the ceiling of indexer-cli bench's per-layer "
      "round trip"};
  int64_t request_bytes = 524288 + 16384 + 32768;
  int64_t reply_bytes = 64 * 2048 * 4;
  int iters = 1000;
  int warmup = 50;
  int64_t small_bytes = 200;
  app.add_option("--request-bytes", request_bytes, "bytes per request")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{kHeaderBytes}, int64_t{1} << 30));
  app.add_option("--reply-bytes", reply_bytes, "bytes per reply")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  app.add_option("--iters", iters, "measured round trips")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--warmup", warmup, "unmeasured first round trips")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--small-bytes", small_bytes,
                 "request and reply bytes of the small-message round trip "
                 "measured after the main one (0 = skip)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  std::vector<std::string> channel_args;
  app.add_option("--arg", channel_args,
                 "NAME=INT gRPC channel argument for both ends, e.g. "
                 "grpc.http2.max_frame_size=1048576 (repeatable)");
  std::string unix_path;
  app.add_option("--unix", unix_path,
                 "serve and connect over this Unix-domain socket path "
                 "instead of TCP 127.0.0.1 (what `indexerd --listen "
                 "unix:PATH` offers co-located front-ends)");
  bool default_transport = false;
  app.add_flag("--default-transport", default_transport,
               "gRPC's and glibc's defaults (unlimited messages only) instead "
               "of indexerd's transport settings (proto/transport_tuning.h)");
  CLI11_PARSE(app, argc, argv);
  if (!default_transport) indexer::transport::TuneAllocator();
  std::vector<std::pair<std::string, int>> int_args;
  for (const std::string& a : channel_args) {
    const size_t eq = a.find('=');
    int value = 0;
    if (eq == std::string::npos ||
        !absl::SimpleAtoi(absl::string_view(a).substr(eq + 1), &value)) {
      std::fprintf(stderr, "--arg: expected NAME=INT, got '%s'\n", a.c_str());
      return 2;
    }
    int_args.emplace_back(a.substr(0, eq), value);
  }

  if (small_bytes > 0 && small_bytes < static_cast<int64_t>(kHeaderBytes)) {
    small_bytes = kHeaderBytes;
  }
  EchoService service(static_cast<size_t>(std::max(reply_bytes, small_bytes)));
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string listen =
      unix_path.empty() ? "127.0.0.1:0" : "unix:" + unix_path;
  if (!unix_path.empty()) std::remove(unix_path.c_str());
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  if (default_transport) {
    builder.SetMaxReceiveMessageSize(-1);
    builder.SetMaxSendMessageSize(-1);
  } else {
    indexer::transport::AddServerArguments(builder, 0);
  }
  for (const auto& [name, value] : int_args) {
    builder.AddChannelArgument(name, value);
  }
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || (unix_path.empty() && port == 0)) {
    std::fprintf(stderr, "could not start the echo server on %s\n",
                 listen.c_str());
    return 1;
  }

  grpc::ChannelArguments args;
  if (default_transport) {
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
  } else {
    indexer::transport::AddChannelArguments(args, 0);
  }
  for (const auto& [name, value] : int_args) args.SetInt(name, value);
  auto channel = grpc::CreateCustomChannel(
      unix_path.empty() ? "127.0.0.1:" + std::to_string(port) : listen,
      grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);

  // Round trips of `req` bytes asking for `rep` bytes on one stream; empty
  // on failure. The request, built once: its header, then a pattern (never
  // zeros).
  auto measure = [&](int64_t req, int64_t rep, double* cpu_us) {
    std::vector<uint8_t> bytes(static_cast<size_t>(req));
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    }
    const uint64_t want = static_cast<uint64_t>(rep);
    std::memcpy(bytes.data(), &want, kHeaderBytes);
    grpc::Slice slice(bytes.data(), bytes.size());
    const grpc::ByteBuffer request(&slice, 1);
    std::vector<double> us;
    us.reserve(iters);
    double cpu_start = 0;
    EchoStream stream(&stub);
    for (int i = 0; i < warmup + iters; ++i) {
      if (i == warmup) cpu_start = ProcessCpuMicros();
      const auto start = std::chrono::steady_clock::now();
      if (!stream.RoundTrip(request, static_cast<size_t>(rep))) {
        return std::vector<double>();
      }
      const double t = std::chrono::duration<double, std::micro>(
                           std::chrono::steady_clock::now() - start)
                           .count();
      if (i >= warmup) us.push_back(t);
    }
    *cpu_us = (ProcessCpuMicros() - cpu_start) / iters;
    return us;
  };
  double cpu_per_trip = 0, small_cpu_per_trip = 0;
  const std::vector<double> us = measure(request_bytes, reply_bytes, &cpu_per_trip);
  if (us.empty()) return 1;
  std::vector<double> small_us;
  if (small_bytes > 0) {
    small_us = measure(small_bytes, small_bytes, &small_cpu_per_trip);
    if (small_us.empty()) return 1;
  }
  server->Shutdown();

  double sum = 0;
  for (double t : us) sum += t;
  std::printf("grpc echo (bidi stream, callback generic server, loopback): "
              "request %lld B, reply %lld B, %d round trips after %d warmup\n",
              static_cast<long long>(request_bytes),
              static_cast<long long>(reply_bytes), iters, warmup);
  std::printf("transport: %s\n", default_transport
                                       ? "gRPC and glibc defaults"
                                       : "indexerd's (proto/transport_tuning.h)");
  for (const auto& [name, value] : int_args) {
    std::printf("channel arg %s = %d\n", name.c_str(), value);
  }
  std::printf("round trip p50 %.1f us, p99 %.1f us (min %.1f, mean %.1f, "
              "max %.1f)\n",
              Percentile(us, 50), Percentile(us, 99),
              *std::min_element(us.begin(), us.end()), sum / us.size(),
              *std::max_element(us.begin(), us.end()));
  // CPU time is the work of both ends; unlike the wall time it barely moves
  // when other processes share the cores.
  std::printf("round trip p10 %.1f us; process cpu %.1f us per round trip\n",
              Percentile(us, 10), cpu_per_trip);
  if (!small_us.empty()) {
    std::printf("small message (request %lld B, reply %lld B), the floor of any call: "
                "round trip p50 %.1f us, p99 %.1f us (min %.1f); process cpu %.1f us "
                "per round trip\n",
                static_cast<long long>(small_bytes), static_cast<long long>(small_bytes),
                Percentile(small_us, 50), Percentile(small_us, 99),
                *std::min_element(small_us.begin(), small_us.end()), small_cpu_per_trip);
  }
  return 0;
}
