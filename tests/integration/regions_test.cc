// The data plane end to end (cpu backend): Q, weights and K by reference to
// a host region, the top-k through topk_out, checked against the shadow
// reference like the inline path; every bad reference with its status, the
// field named and the cache unchanged; ownership across two client
// identities; unregister during a step; the lease; a killed client.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "client/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "indexer/client.h"
#include "server/rpc/convert.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using client::ShmRegion;

constexpr size_t kShmBytes = 4 << 20;
// The sequence namespace of client "client-a" on a plaintext listener
// (server/rpc/identity.h).
const std::string kNsA = "hdr:client-a";

std::string UniqueShm(const std::string& what) {
  static int counter = 0;
  return "/indexer-regions-test-" + what + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

std::unique_ptr<IndexerClient> ClientAs(int port, const std::string& id) {
  client::ClientOptions options;
  options.client_id = id;
  auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(port), options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

uint64_t Align16(uint64_t x) { return (x + 15) & ~uint64_t{15}; }

// A registered host region of one client.
struct HostRegion {
  ShmRegion shm;
  uint64_t id = 0;
};

HostRegion Register(IndexerClient& c, size_t bytes = kShmBytes) {
  HostRegion r;
  auto shm = ShmRegion::Create(UniqueShm("r"), bytes);
  EXPECT_TRUE(shm.ok()) << shm.status();
  r.shm = *std::move(shm);
  auto resp = c.RegisterHostRegion("test", r.shm.name(), 0, bytes);
  EXPECT_TRUE(resp.ok()) << resp.status();
  if (resp.ok()) r.id = resp->region();
  return r;
}

std::vector<int64_t> TopkShape(const TestLayer& t, int64_t rows) {
  if (t.role == Role::kBlock) return {t.num_heads, rows, t.topk};
  return {rows, t.topk};
}

// Moves every inline tensor of `r` into the region (16-byte aligned, from
// offset 0), references it instead, and names the next aligned span as
// topk_out. Returns topk_out's offset.
uint64_t ToRefs(v1::LayerRequest& r, const HostRegion& region, int64_t topk_bytes) {
  uint64_t at = 0;
  std::vector<v1::Tensor*> present;
  if (r.has_k()) present.push_back(r.mutable_k());
  if (r.has_q()) present.push_back(r.mutable_q());
  if (r.has_q_scale()) present.push_back(r.mutable_q_scale());
  if (r.has_weights()) present.push_back(r.mutable_weights());
  for (v1::Tensor* t : present) {
    const std::string data = std::move(*t->mutable_data());
    t->clear_data();
    EXPECT_LE(at + data.size(), region.shm.size());
    std::memcpy(region.shm.data() + at, data.data(), data.size());
    *t->mutable_ref() = client::MakeTensorRef(region.id, at, data.size());
    at = Align16(at + data.size());
  }
  *r.mutable_topk_out() = client::MakeTensorRef(region.id, at, topk_bytes);
  return at;
}

// WireStep with every tensor by reference and the top-k through topk_out.
void RegionStep(Daemon& d, Shadow& shadow, const std::vector<SeqStep>& seqs,
                IndexerClient& client, const HostRegion& region) {
  auto step = client.OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<LayerData> data = shadow.Make(seqs);
  for (size_t li = 0; li < d.layers().size(); ++li) {
    const TestLayer& t = d.layers()[li];
    const std::vector<int64_t> shape = TopkShape(t, data[li].rows);
    const int64_t n = client::NumElements(shape);
    v1::LayerRequest r = Request(t, data[li], Form::kFloat);
    const uint64_t out = ToRefs(r, region, n * 4);
    std::memset(region.shm.data() + out, 0xee, n * 4);
    auto reply = (*step)->RunLayer(r);
    ASSERT_TRUE(reply.ok()) << reply.status();
    // dtype and shape only; the indices are in the region.
    EXPECT_EQ(reply->topk().dtype(), v1::INT32);
    EXPECT_THAT(std::vector<int64_t>(reply->topk().shape().begin(), reply->topk().shape().end()),
                ::testing::ElementsAreArray(shape));
    EXPECT_TRUE(reply->topk().data().empty());
    std::vector<int32_t> topk(n);
    std::memcpy(topk.data(), region.shm.data() + out, n * 4);
    shadow.Check(li, seqs, data[li], topk.data());
  }
  auto committed = (*step)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  shadow.Commit(seqs, data);
  ASSERT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

config::ServerConfig TwoGroups(uint64_t lease_ms = 0) {
  config::ServerConfig cfg =
      MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64},
                  {.format = "mxfp4", .compress_ratio = 4, .num_layers = 1, .pages = 64}});
  cfg.set_region_lease_ms(lease_ms);
  return cfg;
}

TEST(RegionsTest, StepsByReferenceMatchTheReference) {
  Daemon d(MakeConfig({{.format = "fp8", .page_entries = 16, .num_layers = 3, .pages = 256,
                        .cand_block = 2, .cand_topk_blocks = 5},
                       {.format = "mxfp4", .page_entries = 16, .compress_ratio = 4, .tiled = true,
                        .num_layers = 1, .pages = 256},
                       {.format = "mxfp4", .page_entries = 32, .num_layers = 1, .heads = 4,
                        .pages = 256, .block_topk = 4, .local_blocks = 2}}));
  auto info = d.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->features(), Contains("host_regions"));
  if (d.engine().backend().Kind() == "gpu") {
    EXPECT_THAT(info->features(), Contains("device_regions"));
  } else {
    EXPECT_THAT(info->features(), Not(Contains("device_regions")));
  }
  auto c = ClientAs(d.port(), "fe-0");
  HostRegion region = Register(*c);
  Shadow shadow(d.layers(), 5);
  RegionStep(d, shadow, {{"p", 200}, {"q", 9}}, *c, region);
  for (int i = 0; i < 3; ++i) RegionStep(d, shadow, {{"p", 1}, {"q", 1}}, *c, region);
  // Inline and by-reference steps mix freely on the same sequences.
  WireStep(d, shadow, {{"p", 1}, {"q", 1}}, Form::kFloat, c.get());
  RegionStep(d, shadow, {{"q", 40}, {"p", 1}, {"n", 3}}, *c, region);
  auto list = c->ListRegions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].region(), region.id);
  EXPECT_EQ((*list)[0].kind(), "host");
  EXPECT_EQ((*list)[0].bytes(), kShmBytes);
  EXPECT_EQ((*list)[0].where(), region.shm.name());
  EXPECT_TRUE(c->UnregisterRegion(region.id).ok());
  EXPECT_TRUE(c->ListRegions()->empty());
}

class RegionErrors : public ::testing::Test {
 protected:
  RegionErrors() : d_(TwoGroups()), shadow_(d_.layers(), 3) {
    a_ = ClientAs(d_.port(), "client-a");
    b_ = ClientAs(d_.port(), "client-b");
    region_ = Register(*a_);
  }
  void SetUp() override {
    RegionStep(d_, shadow_, {{"a", 30}, {"b", 2}}, *a_, region_);
    usage_ = d_.engine().Usage();
  }
  void ExpectRejected(const absl::Status& s, absl::StatusCode code, const std::string& field) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
    ExpectUnchanged();
  }
  void ExpectUnchanged() {
    d_.WaitIdle();
    EXPECT_EQ(*d_.engine().SequenceLength(SeqName::Named("a", kNsA)), 30);
    EXPECT_EQ(*d_.engine().SequenceLength(SeqName::Named("b", kNsA)), 2);
    const std::vector<GroupUsage> now = d_.engine().Usage();
    for (size_t g = 0; g < now.size(); ++g) EXPECT_EQ(now[g].free_pages, usage_[g].free_pages);
    EXPECT_TRUE(d_.engine().CheckInvariants().ok()) << d_.engine().CheckInvariants();
  }
  // Opens a step over {a:1, b:1} as `who` and runs layer 0 by reference to
  // region_ with `mutate` applied.
  absl::Status RunBadLayer(const std::function<void(v1::LayerRequest&)>& mutate,
                           IndexerClient* who = nullptr) {
    if (who == nullptr) who = a_.get();
    const std::vector<SeqStep> seqs = {{"a", 1}, {"b", 1}};
    auto step = who->OpenStep(Header(seqs, shadow_));
    if (!step.ok()) return step.status();
    std::vector<LayerData> data = shadow_.Make(seqs);
    v1::LayerRequest r = Request(d_.layers()[0], data[0], Form::kFloat);
    ToRefs(r, region_, 2 * d_.layers()[0].topk * 4);
    mutate(r);
    return (*step)->RunLayer(r).status();
  }

  Daemon d_;
  Shadow shadow_;
  std::unique_ptr<IndexerClient> a_, b_;
  HostRegion region_;
  std::vector<GroupUsage> usage_;
};

TEST_F(RegionErrors, UnknownRegion) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) { r.mutable_q()->mutable_ref()->set_region(999); }),
                 absl::StatusCode::kNotFound, "layer 0: q.ref.region: region 999 not found");
}

TEST_F(RegionErrors, ReleasedRegion) {
  HostRegion other = Register(*a_, 1 << 20);
  ASSERT_TRUE(a_->UnregisterRegion(other.id).ok());
  const std::string id = std::to_string(other.id);
  ExpectRejected(RunBadLayer([&](v1::LayerRequest& r) {
                   r.mutable_weights()->mutable_ref()->set_region(other.id);
                 }),
                 absl::StatusCode::kNotFound, "weights.ref.region: region " + id + " not found");
  ExpectRejected(a_->UnregisterRegion(other.id), absl::StatusCode::kNotFound, "region " + id);
}

TEST_F(RegionErrors, AnotherClientsRegion) {
  const std::string id = std::to_string(region_.id);
  // b uses a's region in a step over a sequence of its own (b does not see
  // a's sequences): the region is as unknown as any other id.
  {
    v1::StepHeader h;
    v1::StepSequence* ss = h.add_sequences();
    *ss->mutable_id() = client::NamedSequenceId("b-own");
    ss->set_q_len(1);
    ss->set_create(true);
    auto step = b_->OpenStep(h);
    ASSERT_TRUE(step.ok()) << step.status();
    Shadow b_shadow(d_.layers(), 4);
    std::vector<LayerData> data = b_shadow.Make({{"b-own", 1}});
    v1::LayerRequest r = Request(d_.layers()[0], data[0], Form::kFloat);
    ToRefs(r, region_, d_.layers()[0].topk * 4);
    ExpectRejected((*step)->RunLayer(r).status(), absl::StatusCode::kNotFound,
                   "k.ref.region: region " + id + " not found");
  }
  auto listed = b_->ListRegions();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  ExpectRejected(b_->UnregisterRegion(region_.id), absl::StatusCode::kNotFound, "region " + id);
  // a's region is still there and works.
  EXPECT_EQ(a_->ListRegions()->size(), 1u);
  RegionStep(d_, shadow_, {{"a", 1}}, *a_, region_);
}

TEST_F(RegionErrors, BeyondTheRegion) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) {
                   r.mutable_q()->mutable_ref()->set_offset(kShmBytes - 16);
                 }),
                 absl::StatusCode::kInvalidArgument,
                 "q.ref.bytes: expected offset + bytes <= " + std::to_string(kShmBytes));
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) {
                   r.mutable_topk_out()->set_offset(kShmBytes);
                 }),
                 absl::StatusCode::kInvalidArgument, "topk_out.bytes: expected offset + bytes");
}

TEST_F(RegionErrors, MisalignedOffset) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) {
                   auto* ref = r.mutable_k()->mutable_ref();
                   ref->set_offset(ref->offset() + 8);
                 }),
                 absl::StatusCode::kInvalidArgument, "k.ref.offset: expected a multiple of 16");
}

TEST_F(RegionErrors, ByteCountIsNotShapeTimesDtype) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) {
                   auto* ref = r.mutable_q()->mutable_ref();
                   ref->set_bytes(ref->bytes() - 16);
                 }),
                 absl::StatusCode::kInvalidArgument, "q: expected [2, 8, 128] FP32");
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) {
                   auto* ref = r.mutable_topk_out();
                   ref->set_bytes(ref->bytes() + 16);
                 }),
                 absl::StatusCode::kInvalidArgument, "topk_out.bytes: expected 128 ([2, 16] INT32)");
}

TEST_F(RegionErrors, DataAndRefTogether) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) { r.mutable_q()->set_data("0123"); }),
                 absl::StatusCode::kInvalidArgument, "q: expected either data or ref, got both");
}

TEST_F(RegionErrors, BadRegistrations) {
  auto small = ShmRegion::Create(UniqueShm("small"), 4096);
  ASSERT_TRUE(small.ok());
  ExpectRejected(a_->RegisterHostRegion("x", UniqueShm("missing"), 0, 4096).status(),
                 absl::StatusCode::kNotFound, "host.shm_name: no shared-memory object");
  ExpectRejected(a_->RegisterHostRegion("x", small->name(), 0, 8192).status(),
                 absl::StatusCode::kInvalidArgument,
                 "host.bytes: expected offset + bytes <= the object's size (4096 bytes");
  ExpectRejected(a_->RegisterHostRegion("x", small->name(), 0, 0).status(),
                 absl::StatusCode::kInvalidArgument, "host.bytes: expected >= 1");
  ExpectRejected(a_->RegisterHostRegion("x", small->name(), 16, 16).status(),
                 absl::StatusCode::kInvalidArgument, "host.offset: expected a multiple of");
  ExpectRejected(a_->RegisterHostRegion("", small->name(), 0, 16).status(),
                 absl::StatusCode::kInvalidArgument, "name: expected 1..128 bytes");
  // Garbage IPC handle bytes: no device regions on the cpu backend; on a
  // gpu backend (INDEXER_TEST_DEVICE) the handle does not open.
  const std::string garbage(64, '\x5a');
  auto dev = a_->RegisterDeviceRegion("dev", garbage, "GPU-00000000-0000-0000-0000-000000000000",
                                      "", 0, 4096);
  if (d_.engine().backend().Kind() == "gpu") {
    ExpectRejected(dev.status(), absl::StatusCode::kFailedPrecondition,
                   "region \"dev\": device.device_uuid");
  } else {
    ExpectRejected(dev.status(), absl::StatusCode::kFailedPrecondition,
                   "region \"dev\": device: device regions need the gpu backend");
  }
  // A device region starting off the 16-byte grid (a slice of an
  // allocation at an odd offset): refused on any backend, naming the field.
  ExpectRejected(a_->RegisterDeviceRegion("dev", garbage, "", "", 4, 4096).status(),
                 absl::StatusCode::kInvalidArgument,
                 "device.offset: expected a multiple of 16, got 4");
  EXPECT_EQ(a_->ListRegions()->size(), 1u);  // only the fixture's
}

// On the cpu backend, device tensors (device regions) are refused before
// anything is written: FAILED_PRECONDITION naming the gpu backend. (On the
// gpu backend they are served: tests/gpu/gpu_device_tensors_test compares
// them with host tensors bit for bit.)
TEST_F(RegionErrors, DeviceTensorsNeedTheGpuBackend) {
  if (d_.engine().backend().Kind() != "cpu") GTEST_SKIP() << "the cpu backend's refusal";
  const std::vector<SeqStep> seqs = {{"a", 1}, {"b", 1}};
  StepSpec spec;
  for (const auto& [name, q] : seqs) spec.seqs.push_back({SeqName::Named(name, kNsA), q, false});
  std::vector<LayerData> data = shadow_.Make(seqs);
  const v1::LayerRequest r = Request(d_.layers()[0], data[0], Form::kFloat);
  // Never dereferenced: the engine hands device pointers to the backend only.
  static const int64_t kNotOnTheHost[8] = {};
  auto to_device = [](TensorView& v) {
    v.on_device = true;
    v.device_ptr = kNotOnTheHost;
    v.device_bytes = static_cast<int64_t>(v.data.size());
    v.data = absl::string_view();
  };
  for (const char* which : {"k", "q", "weights", "topk_out"}) {
    auto step = d_.engine().BeginStep(spec);
    ASSERT_TRUE(step.ok()) << step.status();
    LayerInput in = ToLayerInput(r);
    const std::string w = which;
    if (w == "k") to_device(in.k);
    if (w == "q") to_device(in.q);
    if (w == "weights") to_device(in.weights);
    if (w == "topk_out") {
      in.out_device = const_cast<int64_t*>(kNotOnTheHost);
      in.out_device_bytes = 2 * 16 * 4;
    }
    const absl::Status status = (*step)->RunLayer(in).status();
    step->reset();  // the transport aborts a step whose layer failed
    ExpectRejected(status, absl::StatusCode::kFailedPrecondition, "gpu backend");
  }
}

// A region unregistered between two layers of a step: the next layer's
// reference is refused and the step rolls back (the layer that ran before
// held its pin until its reply, see region_registry_test for the unmap).
TEST_F(RegionErrors, UnregisteredDuringAStep) {
  const std::vector<SeqStep> seqs = {{"a", 1}, {"b", 1}};
  auto step = a_->OpenStep(Header(seqs, shadow_));
  ASSERT_TRUE(step.ok());
  std::vector<LayerData> data = shadow_.Make(seqs);
  v1::LayerRequest r0 = Request(d_.layers()[0], data[0], Form::kFloat);
  ToRefs(r0, region_, 2 * d_.layers()[0].topk * 4);
  ASSERT_TRUE((*step)->RunLayer(r0).ok());
  ASSERT_TRUE(a_->UnregisterRegion(region_.id).ok());
  v1::LayerRequest r1 = Request(d_.layers()[1], data[1], Form::kFloat);
  ToRefs(r1, region_, 2 * d_.layers()[1].topk * 4);
  ExpectRejected((*step)->RunLayer(r1).status(), absl::StatusCode::kNotFound,
                 "layer 1: k.ref.region: region " + std::to_string(region_.id) + " not found");
}

// A region unregistered while layers that use it are in flight on another
// thread: each layer either completes with the right top-k or is refused
// with NOT_FOUND; never a crash or a read of unmapped memory.
TEST_F(RegionErrors, UnregisterRacesLayers) {
  std::atomic<bool> started{false};
  std::thread unregister([&] {
    while (!started.load()) std::this_thread::yield();
    EXPECT_TRUE(a_->UnregisterRegion(region_.id).ok());
  });
  bool refused = false;
  for (int i = 0; i < 20 && !refused; ++i) {
    const std::vector<SeqStep> seqs = {{"a", 1}};
    auto step = a_->OpenStep(Header(seqs, shadow_));
    ASSERT_TRUE(step.ok());
    std::vector<LayerData> data = shadow_.Make(seqs);
    std::vector<int32_t> topk;
    for (size_t li = 0; li < d_.layers().size() && !refused; ++li) {
      const TestLayer& t = d_.layers()[li];
      v1::LayerRequest r = Request(t, data[li], Form::kFloat);
      const int64_t n = client::NumElements(TopkShape(t, data[li].rows));
      const uint64_t out = ToRefs(r, region_, n * 4);
      started = true;
      auto reply = (*step)->RunLayer(r);
      if (!reply.ok()) {
        EXPECT_EQ(reply.status().code(), absl::StatusCode::kNotFound) << reply.status();
        refused = true;
        break;
      }
      topk.assign(n, 0);
      std::memcpy(topk.data(), region_.shm.data() + out, n * 4);
      shadow_.Check(li, seqs, data[li], topk.data());
    }
    if (refused) break;
    ASSERT_TRUE((*step)->Commit().ok());
    shadow_.Commit(seqs, data);
  }
  unregister.join();
  EXPECT_TRUE(refused);
  d_.WaitIdle();
  EXPECT_TRUE(d_.engine().CheckInvariants().ok()) << d_.engine().CheckInvariants();
}

TEST(RegionsTest, LeaseExpires) {
  constexpr uint64_t kLeaseMs = 100;
  Daemon d(TwoGroups(kLeaseMs));
  auto c = ClientAs(d.port(), "fe-lease");
  auto shm = ShmRegion::Create(UniqueShm("lease"), 4096);
  ASSERT_TRUE(shm.ok());
  const auto registered = std::chrono::steady_clock::now();
  auto reg = c->RegisterHostRegion("lease", shm->name(), 0, 4096);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ(reg->lease_ms(), kLeaseMs);
  auto listed = c->ListRegions();
  ASSERT_TRUE(listed.ok());
  // Listed unless this process stalled for a whole lease (a loaded machine).
  if (std::chrono::steady_clock::now() - registered < std::chrono::milliseconds(kLeaseMs)) {
    ASSERT_EQ(listed->size(), 1u);
  }
  // A full lease without use (a lower bound, not a race): dropped.
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs + 20));
  EXPECT_TRUE(c->ListRegions()->empty());
  EXPECT_EQ(c->UnregisterRegion(reg->region()).code(), absl::StatusCode::kNotFound);
}

// A front-end (indexer-cli bench --transport host) killed with SIGKILL while
// it holds a region and an open step: the step rolls back and, after the
// lease, its region is gone.
TEST(RegionsTest, ClientKilledHoldingRegions) {
  // Long enough that the running bench (which renews it every layer) never
  // loses its region on a loaded machine.
  constexpr uint64_t kLeaseMs = 1000;
  Daemon d(TwoGroups(kLeaseMs));
  auto same = ClientAs(d.port(), "killed");
  const KilledClient k = SpawnBenchAndKill(INDEXER_CLI_PATH, d.port(), "killed", "host", [&] {
    return d.engine().open_steps() > 0 && d.engine().num_sequences() == 2 &&
           same->ListRegions().ok() && !same->ListRegions()->empty();
  }, 2000);
  UnlinkShmOfKilled(k.pid);
  ASSERT_TRUE(k.holding) << "the client never held a region and an open step";
  d.WaitIdle();
  EXPECT_EQ(d.engine().num_sequences(), 2);  // its committed sequences stay
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs + 50));
  auto left = same->ListRegions();
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
}

}  // namespace
}  // namespace indexer::testing
