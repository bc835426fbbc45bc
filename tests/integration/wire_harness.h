// The end-to-end harness shared by the integration suites: the daemon on
// 127.0.0.1:0 over the backend under test, driven through the client
// library, and the wire forms of a Shadow step.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "indexer/client.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/rpc/server.h"
#include "tests/integration/test_config.h"

namespace indexer::testing {

namespace v1 = ::indexer::v1;
using client::IndexerClient;

// The backend under test: the cpu backend, or INDEXER_TEST_DEVICE (e.g.
// "gpu:0") to run the same suite against another one on the device.
inline std::unique_ptr<Backend> TestBackend() {
  const char* device = std::getenv("INDEXER_TEST_DEVICE");
  if (device == nullptr || *device == 0) return std::make_unique<CpuBackend>(2);
  auto backend = MakeBackend(device, 2);
  EXPECT_TRUE(backend.ok()) << backend.status();
  static bool once = [&] {
    if (backend.ok()) std::printf("[  backend ] %s\n", (*backend)->Describe().c_str());
    return true;
  }();
  (void)once;
  return backend.ok() ? *std::move(backend) : nullptr;
}

// The daemon under test on 127.0.0.1:0: `cfg`'s model over TestBackend(),
// with `cfg`'s listener security. Sets `*layers` to the model's test layers.
inline std::unique_ptr<RunningServer> StartTestServer(const config::ServerConfig& cfg,
                                                      std::vector<TestLayer>* layers) {
  auto model = BuildModel(cfg);
  EXPECT_TRUE(model.ok()) << model.status();
  *layers = TestLayers(*model);
  auto engine = Engine::Create(*std::move(model), TestBackend());
  EXPECT_TRUE(engine.ok()) << engine.status();
  auto server = StartServer(*std::move(engine), "127.0.0.1:0");
  EXPECT_TRUE(server.ok()) << server.status();
  return *std::move(server);
}

// StartTestServer plus a plaintext client of its own.
class Daemon {
 public:
  explicit Daemon(const config::ServerConfig& cfg) {
    server_ = StartTestServer(cfg, &layers_);
    auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(server_->port()));
    EXPECT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }
  Engine& engine() { return server_->engine(); }
  IndexerService& service() { return server_->service(); }
  IndexerClient& client() { return *client_; }
  void Shutdown(int grace_ms) { server_->Shutdown(grace_ms); }
  const std::vector<TestLayer>& layers() const { return layers_; }
  int port() const { return server_->port(); }
  // Another client of its own channel, as a second front-end process has.
  std::unique_ptr<IndexerClient> NewClient() {
    auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(port()));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Steps end asynchronously on the server after a cancel: wait for it.
  // A deadline, not a count of looks: on two loaded cores the rollback can
  // queue behind other work for longer than a few hundred short sleeps.
  void WaitIdle() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (engine().open_steps() > 0 && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_EQ(engine().open_steps(), 0);
  }

 private:
  std::vector<TestLayer> layers_;
  std::unique_ptr<RunningServer> server_;
  std::unique_ptr<IndexerClient> client_;
};

enum class Form { kFloat, kNative };

inline v1::LayerRequest Request(const TestLayer& t, const LayerData& d, Form form) {
  const PageLayout& L = t.layout;
  const int64_t D = L.head_dim, H = t.num_heads;
  v1::LayerRequest r;
  r.set_layer(t.layer);
  if (t.role == Role::kBlock) {
    *r.mutable_k() = client::MakeByteTensor(v1::UINT8, d.k_quant, {d.n_new, L.entry_bytes()});
    *r.mutable_q() = client::MakeFp32Tensor(d.q_float, {d.rows, H, D});
    return r;
  }
  if (form == Form::kFloat) {
    *r.mutable_k() = client::MakeFp32Tensor(d.k_float, {d.n_new, D});
    *r.mutable_q() = client::MakeFp32Tensor(d.q_float, {d.rows, H, D});
    *r.mutable_weights() = client::MakeFp32Tensor(d.weights, {d.rows, H});
    return r;
  }
  *r.mutable_k() = client::MakeByteTensor(v1::UINT8, d.k_quant, {d.n_new, L.entry_bytes()});
  if (L.format == KvFormat::kFp8) {
    *r.mutable_q() = client::MakeByteTensor(v1::FP8_E4M3, d.q_codes, {d.rows, H, D});
  } else {
    *r.mutable_q() = client::MakeByteTensor(v1::UINT8, d.q_codes, {d.rows, H, D / 2});
    *r.mutable_q_scale() = client::MakeByteTensor(v1::UINT8, d.q_scales, {d.rows, H, D / 32});
  }
  *r.mutable_weights() = client::MakeFp32Tensor(d.w_folded, {d.rows, H});
  return r;
}

inline v1::StepHeader Header(const std::vector<SeqStep>& seqs, const Shadow& shadow) {
  v1::StepHeader h;
  for (const auto& [s, q] : seqs) {
    v1::StepSequence* ss = h.add_sequences();
    *ss->mutable_id() = client::NamedSequenceId(s);
    ss->set_q_len(q);
    ss->set_create(shadow.len(s) == 0);
  }
  return h;
}

// One full step through the wire: every layer checked, then commit.
// `client` defaults to the daemon's own.
inline void WireStep(Daemon& d, Shadow& shadow, const std::vector<SeqStep>& seqs, Form form,
                     IndexerClient* client = nullptr) {
  if (client == nullptr) client = &d.client();
  auto step = client->OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<LayerData> data = shadow.Make(seqs);
  for (size_t li = 0; li < d.layers().size(); ++li) {
    const TestLayer& t = d.layers()[li];
    auto reply = (*step)->RunLayer(Request(t, data[li], form));
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(reply->layer(), static_cast<uint32_t>(t.layer));
    std::vector<int64_t> shape = {data[li].rows, t.topk};
    if (t.role == Role::kBlock) shape = {t.num_heads, data[li].rows, t.topk};
    auto topk = client::ReadInt32Tensor(reply->topk(), shape, "topk");
    ASSERT_TRUE(topk.ok()) << topk.status();
    shadow.Check(li, seqs, data[li], topk->data());
    EXPECT_GT(reply->timings().total_us(), 0);
  }
  auto committed = (*step)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  shadow.Commit(seqs, data);
  ASSERT_EQ(committed->seq_lens_size(), static_cast<int>(seqs.size()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(committed->seq_lens(i), static_cast<uint64_t>(shadow.len(seqs[i].first)));
  }
  ASSERT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

// `indexer-cli --addr <daemon> --client-id <id> bench --transport <transport>
// ... --steps 10000000` spawned, until `holding()` (polled every 5 ms, at
// most `polls` times) says it holds what the test needs, then killed with
// SIGKILL and reaped. Returns its pid and whether it was holding. The
// shared-memory objects the killed process never unlinked
// (indexer-cli-bench-<pid>-*, indexer-cli-ring-<pid>*) are removed by
// UnlinkShmOfKilled once the test has looked at what it needs.
struct KilledClient {
  pid_t pid = 0;
  bool holding = false;
};
// `built`: the test's INDEXER_CLI_PATH (the tests that spawn the CLI define
// it); $INDEXER_CLI overrides it (tests run away from their build tree).
inline KilledClient SpawnBenchAndKill(const char* built, int port, const std::string& client_id,
                                      const std::string& transport,
                                      const std::function<bool()>& holding, int polls) {
  const std::string addr = "127.0.0.1:" + std::to_string(port);
  const char* cli = std::getenv("INDEXER_CLI") ? std::getenv("INDEXER_CLI") : built;
  const char* argv[] = {cli, "--addr", addr.c_str(), "--client-id", client_id.c_str(), "bench",
                        "--transport", transport.c_str(), "--batch", "2", "--context", "64",
                        "--steps", "10000000", "--warmup", "0", nullptr};
  KilledClient k;
  EXPECT_EQ(posix_spawn(&k.pid, cli, nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  if (k.pid == 0) return k;
  for (int i = 0; i < polls && !k.holding; ++i) {
    k.holding = holding();
    if (!k.holding) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(k.pid, SIGKILL);
  int status = 0;
  waitpid(k.pid, &status, 0);
  return k;
}
inline void UnlinkShmOfKilled(pid_t pid) {
  const std::string bench = "indexer-cli-bench-" + std::to_string(pid) + "-";
  const std::string ring = "indexer-cli-ring-" + std::to_string(pid);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    const std::string n = e.path().filename().string();
    if (n.rfind(bench, 0) == 0 || n.rfind(ring, 0) == 0) shm_unlink(("/" + n).c_str());
  }
}

inline std::string SeqNameOf(const std::string& prefix, int i) { return prefix + std::to_string(i); }

// Appends `tokens` tokens to `name` by WriteEntries (pre-quantized entries),
// in imports of at most max_q_len tokens, and records them in the shadow.
inline void Import(Daemon& d, Shadow& shadow, IndexerClient& client, const std::string& name,
                   int64_t tokens, int64_t max_q_len = std::numeric_limits<int64_t>::max()) {
  while (tokens > 0) {
    const int64_t n = std::min(tokens, max_q_len);
    const std::vector<SeqStep> seqs = {{name, n}};
    std::vector<LayerData> data = shadow.MakeEntries(seqs);
    v1::WriteEntriesRequest w;
    *w.mutable_id() = client::NamedSequenceId(name);
    w.set_create(shadow.len(name) == 0);
    w.set_num_tokens(n);
    for (size_t li = 0; li < d.layers().size(); ++li) {
      const TestLayer& t = d.layers()[li];
      v1::LayerEntries* le = w.add_layers();
      le->set_layer(t.layer);
      *le->mutable_k() = client::MakeByteTensor(v1::UINT8, data[li].k_quant,
                                                {data[li].n_new, t.layout.entry_bytes()});
    }
    auto len = client.WriteEntries(w);
    ASSERT_TRUE(len.ok()) << len.status();
    shadow.Commit(seqs, data);
    ASSERT_EQ(*len, static_cast<uint64_t>(shadow.len(name)));
    tokens -= n;
  }
}

}  // namespace indexer::testing
