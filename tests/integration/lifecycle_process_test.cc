// The daemon process's lifecycle (issue 13 item 6), observed by a client:
// the two-phase drain on SIGTERM (NOT_SERVING first while calls are still
// served, then the drain of open steps, exit 0) and a sticky device error
// (injected on the cpu backend: INDEXERD_TEST_DEVICE_FAULT_AFTER_LAYERS)
// ending the daemon with exit status 3.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/wire_harness.h"

extern char** environ;

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  const auto end = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// grpc.health.v1.Health/Check: 1 SERVING, 2 NOT_SERVING, -1 failed.
int HealthStatus(int port) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty;
  grpc::ByteBuffer request(&empty, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

// indexerd as a child process on 127.0.0.1:0 with a config built here.
class DaemonProcess {
 public:
  DaemonProcess(const config::ServerConfig& cfg, const std::vector<std::string>& flags,
                const std::vector<std::string>& env = {}) {
    dir_ = std::filesystem::temp_directory_path() /
           ("indexerd-life-" + std::to_string(getpid()) + "-" + std::to_string(++counter_));
    std::filesystem::create_directories(dir_);
    std::string text;
    google::protobuf::TextFormat::PrintToString(cfg, &text);
    std::ofstream(dir_ / "config.textproto") << text;
    const char* bin = std::getenv("INDEXERD") ? std::getenv("INDEXERD") : INDEXERD_PATH;
    std::vector<std::string> args = {bin,           "--config",
                                     (dir_ / "config.textproto").string(),
                                     "--device",    "cpu",
                                     "--listen",    "127.0.0.1:0",
                                     "--port-file", (dir_ / "port").string()};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> envs = env;
    for (char** e = environ; *e; ++e) envs.emplace_back(*e);
    std::vector<char*> envp;
    for (std::string& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, (dir_ / "log").c_str(), O_WRONLY | O_CREAT, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    EXPECT_EQ(posix_spawn(&pid_, bin, &fa, nullptr, argv.data(), envp.data()), 0);
    posix_spawn_file_actions_destroy(&fa);
    EXPECT_TRUE(WaitFor([&] {
      std::ifstream in(dir_ / "port");
      std::string line;
      if (std::getline(in, line) && !in.eof()) port_ = std::stoi(line);
      return port_ > 0 || Exited();
    })) << Log();
    EXPECT_GT(port_, 0) << Log();
  }
  ~DaemonProcess() {
    if (!Exited()) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status_, 0);
    }
    std::filesystem::remove_all(dir_);
  }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  // True once the process ended; its wait status is then status().
  bool Exited() {
    if (exited_) return true;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) exited_ = true;
    return exited_;
  }
  int status() const { return status_; }
  std::string Log() const {
    std::ifstream in(dir_ / "log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::unique_ptr<IndexerClient> Client() {
    auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(port_));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

 private:
  static inline int counter_ = 0;
  std::filesystem::path dir_;
  pid_t pid_ = 0;
  int port_ = 0;
  int status_ = 0;
  bool exited_ = false;
};

// One committed step through `c` (no Daemon object: the daemon is a process).
void WireStepTo(IndexerClient& c, const std::vector<TestLayer>& layers, Shadow& shadow,
                const std::vector<SeqStep>& seqs) {
  std::vector<LayerData> data = shadow.Make(seqs);
  auto step = c.OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  for (size_t li = 0; li < layers.size(); ++li) {
    auto r = (*step)->RunLayer(Request(layers[li], data[li], Form::kFloat));
    ASSERT_TRUE(r.ok()) << r.status();
  }
  ASSERT_TRUE((*step)->Commit().ok());
  shadow.Commit(seqs, data);
}

config::ServerConfig SmallConfig() {
  return MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
}

std::vector<TestLayer> LayersOf(const config::ServerConfig& cfg) {
  auto m = BuildModel(cfg);
  EXPECT_TRUE(m.ok());
  return TestLayers(*m);
}

// SIGTERM: health turns NOT_SERVING while the process still serves (the
// open step runs its remaining layers and commits, info answers); after
// the delay the daemon drains and exits 0.
TEST(LifecycleProcessTest, TwoPhaseDrainNotServingFirstThenDrain) {
  const config::ServerConfig cfg = SmallConfig();
  const std::vector<TestLayer> layers = LayersOf(cfg);
  DaemonProcess p(cfg, {"--drain-delay-ms", "5000", "--drain-ms", "20000"});
  ASSERT_GT(p.port(), 0);
  auto c = p.Client();
  ASSERT_NE(c, nullptr);
  ASSERT_EQ(HealthStatus(p.port()), 1);
  Shadow shadow(layers, 1);
  const std::vector<SeqStep> seqs = {{"s", 12}};
  std::vector<LayerData> data = shadow.Make(seqs);
  auto step = c->OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE((*step)->RunLayer(Request(layers[0], data[0], Form::kFloat)).ok());

  ASSERT_EQ(kill(p.pid(), SIGTERM), 0);
  // Phase 1: NOT_SERVING, and still serving.
  ASSERT_TRUE(WaitFor([&] { return HealthStatus(p.port()) == 2; })) << p.Log();
  EXPECT_FALSE(p.Exited());
  EXPECT_TRUE(c->GetServerInfo().ok());
  auto layer = (*step)->RunLayer(Request(layers[1], data[1], Form::kFloat));
  ASSERT_TRUE(layer.ok()) << layer.status();
  auto committed = (*step)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->seq_lens(0), 12u);
  // The client goes away (a connected client's finished step session
  // holds the server's shutdown for ~5 s otherwise; not a lifecycle matter).
  step->reset();
  c.reset();
  // Phase 2: the drain, then a clean exit.
  ASSERT_TRUE(WaitFor([&] { return p.Exited(); })) << p.Log();
  EXPECT_TRUE(WIFEXITED(p.status()) && WEXITSTATUS(p.status()) == 0) << p.status() << p.Log();
  const std::string log = p.Log();
  const size_t not_serving = log.find("NOT_SERVING; draining in 5000 ms");
  const size_t draining = log.find("draining open steps");
  ASSERT_NE(not_serving, std::string::npos) << log;
  ASSERT_NE(draining, std::string::npos) << log;
  EXPECT_LT(not_serving, draining);
}

// A second SIGTERM skips the rest of the delay.
TEST(LifecycleProcessTest, SecondSignalSkipsTheDelay) {
  DaemonProcess p(SmallConfig(), {"--drain-delay-ms", "600000"});
  ASSERT_GT(p.port(), 0);
  ASSERT_EQ(kill(p.pid(), SIGTERM), 0);
  ASSERT_TRUE(WaitFor([&] { return HealthStatus(p.port()) == 2; })) << p.Log();
  ASSERT_EQ(kill(p.pid(), SIGTERM), 0);
  ASSERT_TRUE(WaitFor([&] { return p.Exited(); })) << p.Log();
  EXPECT_TRUE(WIFEXITED(p.status()) && WEXITSTATUS(p.status()) == 0) << p.Log();
  EXPECT_THAT(p.Log(), HasSubstr("drain delay skipped"));
}

// An injected sticky device error: the failing layer is UNAVAILABLE and
// the daemon ends with exit status 3.
TEST(LifecycleProcessTest, StickyDeviceErrorExitsNonZero) {
  const config::ServerConfig cfg = SmallConfig();
  const std::vector<TestLayer> layers = LayersOf(cfg);
  // The first step's two layers pass; the next layer fails.
  DaemonProcess p(cfg, {"--drain-delay-ms", "60000"},
                  {"INDEXERD_TEST_DEVICE_FAULT_AFTER_LAYERS=2"});
  ASSERT_GT(p.port(), 0);
  auto c = p.Client();
  ASSERT_NE(c, nullptr);
  Shadow shadow(layers, 2);
  WireStepTo(*c, layers, shadow, {{"s", 8}});
  const std::vector<SeqStep> seqs = {{"s", 1}};
  std::vector<LayerData> data = shadow.Make(seqs);
  auto step = c->OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok());
  auto failed = (*step)->RunLayer(Request(layers[0], data[0], Form::kFloat));
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable) << failed.status();
  // No drain delay after a device error: it exits well before 60 s.
  ASSERT_TRUE(WaitFor([&] { return p.Exited(); })) << p.Log();
  EXPECT_TRUE(WIFEXITED(p.status())) << p.status();
  EXPECT_EQ(WEXITSTATUS(p.status()), 3) << p.Log();
  EXPECT_THAT(p.Log(), HasSubstr("sticky device error"));
}

}  // namespace
}  // namespace indexer::testing
