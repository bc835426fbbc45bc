// Request rings (AttachRing, proto/ring_wire.h) on the cpu backend: steps
// over a ring give the reference's top-k, as the Step stream does on the
// same sequences; bad attach requests name the field and attach nothing;
// DetachRing, unregistering the region and a client killed with SIGKILL
// roll an open step back and release the ring and its region.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "indexer/client.h"
#include "indexer/ring_channel.h"
#include "proto/ring_wire.h"
#include "server/rpc/service.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using client::RingChannel;
using client::RingOptions;
using client::ShmRegion;
namespace rw = ring_wire;

std::unique_ptr<IndexerClient> ClientAs(int port, const std::string& id) {
  client::ClientOptions options;
  options.client_id = id;
  auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(port), options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::string UniqueShm(const std::string& what) {
  static int counter = 0;
  return absl::StrCat("/indexer-ring-test-", what, "-", getpid(), "-", counter++);
}

uint64_t Align16(uint64_t x) { return (x + 15) & ~uint64_t{15}; }

// Whether this process maps the shared-memory object `name` (the daemon
// runs in it).
bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm" + name) != std::string::npos) return true;
  }
  return false;
}

std::vector<int64_t> TopkShape(const TestLayer& t, int64_t rows) {
  if (t.role == Role::kBlock) return {t.num_heads, rows, t.topk};
  return {rows, t.topk};
}

// Moves `r`'s tensors into the ring's data area, references them, and names
// topk_out after them; returns topk_out's offset in the data area.
uint64_t ToRingRefs(v1::LayerRequest& r, RingChannel& ch, int64_t topk_bytes) {
  uint64_t at = 0;
  std::vector<v1::Tensor*> present;
  if (r.has_k()) present.push_back(r.mutable_k());
  if (r.has_q()) present.push_back(r.mutable_q());
  if (r.has_q_scale()) present.push_back(r.mutable_q_scale());
  if (r.has_weights()) present.push_back(r.mutable_weights());
  for (v1::Tensor* t : present) {
    const std::string data = std::move(*t->mutable_data());
    t->clear_data();
    EXPECT_LE(at + data.size(), ch.data_bytes());
    std::memcpy(ch.data() + at, data.data(), data.size());
    *t->mutable_ref() = client::MakeTensorRef(ch.region(), ch.data_offset() + at, data.size());
    at = Align16(at + data.size());
  }
  *r.mutable_topk_out() = client::MakeTensorRef(ch.region(), ch.data_offset() + at, topk_bytes);
  return at;
}

// One step over the ring, every layer checked against the shadow reference.
// `inline_topk`: the top-k comes back in the reply instead of topk_out.
void RingStep(Daemon& d, Shadow& shadow, const std::vector<SeqStep>& seqs, RingChannel& ch,
              bool inline_topk = false) {
  ASSERT_TRUE(ch.Begin(Header(seqs, shadow)).ok());
  std::vector<LayerData> data = shadow.Make(seqs);
  for (size_t li = 0; li < d.layers().size(); ++li) {
    const TestLayer& t = d.layers()[li];
    const std::vector<int64_t> shape = TopkShape(t, data[li].rows);
    const int64_t n = client::NumElements(shape);
    v1::LayerRequest r = Request(t, data[li], Form::kFloat);
    const uint64_t out = ToRingRefs(r, ch, n * 4);
    if (inline_topk) r.clear_topk_out();
    std::memset(ch.data() + out, 0xee, n * 4);
    auto reply = ch.RunLayer(r);
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_THAT(std::vector<int64_t>(reply->topk().shape().begin(), reply->topk().shape().end()),
                ::testing::ElementsAreArray(shape));
    std::vector<int32_t> topk(n);
    if (inline_topk) {
      ASSERT_EQ(reply->topk().data().size(), static_cast<size_t>(n * 4));
      std::memcpy(topk.data(), reply->topk().data().data(), n * 4);
    } else {
      EXPECT_TRUE(reply->topk().data().empty());
      std::memcpy(topk.data(), ch.data() + out, n * 4);
    }
    shadow.Check(li, seqs, data[li], topk.data());
  }
  auto committed = ch.Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  ASSERT_EQ(committed->seq_lens_size(), static_cast<int>(seqs.size()));
  shadow.Commit(seqs, data);
  ASSERT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

config::ServerConfig RingConfig(uint64_t lease_ms = 0) {
  // Dense layers and a candidate source with a consumer.
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .page_entries = 16, .num_layers = 3,
                                          .pages = 256, .cand_block = 2, .cand_topk_blocks = 5}});
  cfg.set_region_lease_ms(lease_ms);
  cfg.set_ring_spin_us(50);
  return cfg;
}

RingOptions SmallRing() {
  RingOptions o;
  o.slot_count = 4;
  o.slot_bytes = 16 << 10;
  o.data_bytes = 2 << 20;
  o.timeout = absl::Seconds(20);
  return o;
}

// The ring and the Step stream on the same sequences: both agree with the
// reference, the sequences' lengths follow both.
TEST(RingTest, StepsMatchTheReferenceAndTheStream) {
  Daemon d(RingConfig());
  auto info = d.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->features(), Contains("host_ring"));
  auto c = ClientAs(d.port(), "fe-ring");
  auto ch = RingChannel::Open(c.get(), SmallRing());
  ASSERT_TRUE(ch.ok()) << ch.status();
  EXPECT_EQ((*ch)->server_spin_us(), 50u);
  EXPECT_EQ(d.service().rings(), 1u);
  Shadow shadow(d.layers(), 5);
  RingStep(d, shadow, {{"p", 100}, {"q", 9}}, **ch);
  for (int i = 0; i < 3; ++i) RingStep(d, shadow, {{"p", 1}, {"q", 1}}, **ch);
  WireStep(d, shadow, {{"p", 1}, {"q", 1}}, Form::kFloat, c.get());
  RingStep(d, shadow, {{"q", 20}, {"p", 1}, {"n", 3}}, **ch, /*inline_topk=*/true);
  WireStep(d, shadow, {{"p", 2}, {"n", 1}}, Form::kFloat, c.get());
  // An error rolls the step back and the ring takes the next header.
  ASSERT_TRUE((*ch)->Begin(Header({{"p", 1}}, shadow)).ok());
  v1::LayerRequest bad;
  bad.set_layer(99);
  auto r = (*ch)->RunLayer(bad);
  EXPECT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("layer 99"));
  d.WaitIdle();
  RingStep(d, shadow, {{"p", 1}, {"q", 1}}, **ch);
  // Abort: rolled back and confirmed.
  ASSERT_TRUE((*ch)->Begin(Header({{"p", 1}}, shadow)).ok());
  EXPECT_TRUE((*ch)->Abort().ok());
  EXPECT_EQ(d.engine().open_steps(), 0);
  RingStep(d, shadow, {{"p", 1}, {"q", 1}}, **ch);
  ch->reset();
  EXPECT_EQ(d.service().rings(), 0u);
  EXPECT_TRUE(c->ListRegions()->empty());
}

// StepAbort on the Step stream: the step rolls back, the stream ends ABORTED.
TEST(RingTest, AbortMessageOnTheStepStream) {
  Daemon d(RingConfig());
  Shadow shadow(d.layers(), 3);
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(d.port()),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Indexer::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Step(&ctx);
  v1::StepRequest header;
  *header.mutable_header() = Header({{"a", 4}}, shadow);
  ASSERT_TRUE(stream->Write(header));
  v1::StepRequest abort;
  abort.mutable_abort();
  ASSERT_TRUE(stream->Write(abort));
  v1::StepResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  grpc::Status st = stream->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("aborted by the client"));
  d.WaitIdle();
  EXPECT_EQ(d.engine().num_sequences(), 0);
}

// A raw ring header in a registered shm region, for the bad-input cases.
struct RawRing {
  ShmRegion shm;
  uint64_t region = 0;
  rw::RingHeader* header() { return reinterpret_cast<rw::RingHeader*>(shm.data()); }
};

RawRing MakeRaw(IndexerClient& c, size_t bytes, uint32_t slots = 2, uint32_t slot_bytes = 4096) {
  RawRing r;
  auto shm = ShmRegion::Create(UniqueShm("raw"), bytes);
  EXPECT_TRUE(shm.ok()) << shm.status();
  r.shm = *std::move(shm);
  auto* h = new (r.shm.data()) rw::RingHeader();
  h->magic = rw::kMagic;
  h->version = rw::kVersion;
  h->slot_count = slots;
  h->slot_bytes = slot_bytes;
  auto reg = c.RegisterHostRegion("raw", r.shm.name(), 0, bytes);
  EXPECT_TRUE(reg.ok()) << reg.status();
  if (reg.ok()) r.region = reg->region();
  return r;
}

void ExpectRefused(Daemon& d, const absl::StatusOr<v1::AttachRingResponse>& got,
                   absl::StatusCode code, const std::string& text, size_t rings) {
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), code) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr(text));
  EXPECT_EQ(d.service().rings(), rings);
}

TEST(RingTest, BadAttachNamesTheFieldAndAttachesNothing) {
  Daemon d(RingConfig());
  auto a = ClientAs(d.port(), "client-a");
  auto b = ClientAs(d.port(), "client-b");
  RawRing good = MakeRaw(*a, 64 << 10);
  {
    RawRing r = MakeRaw(*a, 64 << 10);
    r.header()->magic = 0x12345678;
    ExpectRefused(d, a->AttachRing(r.region, 0), absl::StatusCode::kInvalidArgument,
                  "ring.magic: expected 0x49585247, got 0x12345678", 0);
  }
  {
    RawRing r = MakeRaw(*a, 64 << 10);
    r.header()->version = 7;
    ExpectRefused(d, a->AttachRing(r.region, 0), absl::StatusCode::kInvalidArgument,
                  "ring.version: expected 1, got 7", 0);
  }
  {
    RawRing r = MakeRaw(*a, 64 << 10, 2, 512);
    ExpectRefused(d, a->AttachRing(r.region, 0), absl::StatusCode::kInvalidArgument,
                  "ring.slot_bytes: expected a multiple of 64 in [1024", 0);
  }
  {
    RawRing r = MakeRaw(*a, 64 << 10, 3, 4096);
    ExpectRefused(d, a->AttachRing(r.region, 0), absl::StatusCode::kInvalidArgument,
                  "ring.slot_count: expected a power of two", 0);
  }
  {
    // 256 + 2 x 8 x 4096 bytes do not fit 16 KiB.
    RawRing r = MakeRaw(*a, 16 << 10, 8, 4096);
    ExpectRefused(d, a->AttachRing(r.region, 0), absl::StatusCode::kInvalidArgument,
                  "ring.bytes: expected offset + bytes <= 16384", 0);
  }
  ExpectRefused(d, a->AttachRing(good.region, 32), absl::StatusCode::kInvalidArgument,
                "offset: expected a multiple of 64, got 32", 0);
  ExpectRefused(d, a->AttachRing(good.region + 1000, 0), absl::StatusCode::kNotFound,
                "region: region", 0);
  // Another client's region looks like an unknown one.
  ExpectRefused(d, b->AttachRing(good.region, 0), absl::StatusCode::kNotFound,
                absl::StrCat("region ", good.region, " not found"), 0);
  auto ok = a->AttachRing(good.region, 0);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(d.service().rings(), 1u);
  ExpectRefused(d, a->AttachRing(good.region, 0), absl::StatusCode::kAlreadyExists,
                absl::StrCat("region: region ", good.region, " already holds ring"), 1);
  // Only its owner detaches it.
  EXPECT_EQ(b->DetachRing(ok->ring()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(d.service().rings(), 1u);
  // Eight per client.
  std::vector<RawRing> more;
  for (int i = 0; i < 7; ++i) {
    more.push_back(MakeRaw(*a, 64 << 10));
    ASSERT_TRUE(a->AttachRing(more.back().region, 0).ok());
  }
  RawRing ninth = MakeRaw(*a, 64 << 10);
  ExpectRefused(d, a->AttachRing(ninth.region, 0), absl::StatusCode::kResourceExhausted,
                "this client has 8 rings attached", 8);
  auto detached = a->DetachRing(ok->ring());
  ASSERT_TRUE(detached.ok()) << detached.status();
  EXPECT_FALSE(*detached);
  EXPECT_EQ(d.service().rings(), 7u);
  EXPECT_EQ(good.header()->detached.load(), 1u);
}

// Detach and unregister with an open step: rolled back, nothing left.
TEST(RingTest, DetachAndUnregisterRollBackTheOpenStep) {
  Daemon d(RingConfig());
  auto c = ClientAs(d.port(), "fe-detach");
  Shadow shadow(d.layers(), 3);
  for (int way = 0; way < 2; ++way) {
    auto ch = RingChannel::Open(c.get(), SmallRing());
    ASSERT_TRUE(ch.ok()) << ch.status();
    ASSERT_TRUE((*ch)->Begin(Header({{"s", 40}}, shadow)).ok());
    std::vector<LayerData> data = shadow.Make({{"s", 40}});
    const TestLayer& t = d.layers()[0];
    v1::LayerRequest r = Request(t, data[0], Form::kFloat);
    ToRingRefs(r, **ch, client::NumElements(TopkShape(t, data[0].rows)) * 4);
    ASSERT_TRUE((*ch)->RunLayer(r).ok());
    EXPECT_EQ(d.engine().open_steps(), 1);
    if (way == 0) {
      auto rolled = c->DetachRing((*ch)->ring());
      ASSERT_TRUE(rolled.ok()) << rolled.status();
      EXPECT_TRUE(*rolled);
    } else {
      ASSERT_TRUE(c->UnregisterRegion((*ch)->region()).ok());
    }
    EXPECT_EQ(d.engine().open_steps(), 0);
    EXPECT_EQ(d.engine().num_sequences(), 0);
    EXPECT_EQ(d.service().rings(), 0u);
    EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
    // The channel sees the ring gone.
    auto after = (*ch)->Commit();
    EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition) << after.status();
  }
}

// Four co-located front-ends at once, each with its own identity, ring and
// sequences, the way a serving engine's workers drive the daemon: a prefill
// of 12 sequences, committed decode steps, an import and a gRPC step
// between ring steps, releases and new sequences in a mixed step. Every
// top-k checked; at the end no ring, region, sequence or page is left.
TEST(RingTest, SeveralRingClientsCommitWithImportsAndReleases) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .page_entries = 16, .num_layers = 2,
                                          .pages = 1600, .cand_block = 2,
                                          .cand_topk_blocks = 5},
                                         {.format = "mxfp4", .page_entries = 16,
                                          .compress_ratio = 4, .num_layers = 1, .heads = 8,
                                          .topk = 16, .pages = 600}},
                                        /*next_n=*/2);
  cfg.set_ring_spin_us(20);
  Daemon d(cfg);
  const std::vector<GroupUsage> empty = d.engine().Usage();
  constexpr int kClients = 4, kSeqs = 12;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      auto client = ClientAs(d.port(), "fe-" + std::to_string(c));
      if (client == nullptr) return void(++failures);
      RingOptions o = SmallRing();
      o.data_bytes = 4 << 20;
      auto ch = RingChannel::Open(client.get(), o);
      if (!ch.ok()) {
        ADD_FAILURE() << "client " << c << ": " << ch.status();
        return void(++failures);
      }
      Shadow shadow(d.layers(), 91 + c);
      const std::string p = "r" + std::to_string(c) + "-";
      std::vector<SeqStep> prefill, decode;
      for (int i = 0; i < kSeqs; ++i) {
        prefill.push_back({SeqNameOf(p, i), 1 + (i * 29 + c * 13) % 70});
        decode.push_back({SeqNameOf(p, i), 1 + (i + c) % 2});
      }
      RingStep(d, shadow, prefill, **ch);
      for (int step = 0; step < 5; ++step) {
        RingStep(d, shadow, decode, **ch, /*inline_topk=*/step == 3);
        if (step == 1) Import(d, shadow, *client, SeqNameOf(p, 0), 300 + 17 * c);
        if (step == 2) WireStep(d, shadow, decode, Form::kNative, client.get());
        if (step == 3) {
          // Release the last three, then bring three new ones in a mixed step.
          std::vector<v1::SequenceId> ids;
          for (int i = kSeqs - 3; i < kSeqs; ++i) {
            ids.push_back(client::NamedSequenceId(SeqNameOf(p, i)));
            shadow.Forget(SeqNameOf(p, i));
          }
          if (!client->Release(ids).ok()) ++failures;
          for (int i = kSeqs - 3; i < kSeqs; ++i) decode[i].first = SeqNameOf(p + "new", i);
          std::vector<SeqStep> mixed = decode;
          for (int i = kSeqs - 3; i < kSeqs; ++i) mixed[i].second = 30 + i;
          RingStep(d, shadow, mixed, **ch);
        }
      }
      std::vector<v1::SequenceId> ids;
      for (const auto& [name, q] : decode) ids.push_back(client::NamedSequenceId(name));
      if (!client->Release(ids).ok()) ++failures;
      ch->reset();
      auto left = client->ListRegions();
      if (!left.ok() || !left->empty()) ++failures;
      if (::testing::Test::HasFailure()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(d.service().rings(), 0u);
  EXPECT_EQ(d.engine().num_sequences(), 0);
  EXPECT_EQ(d.engine().open_steps(), 0);
  const std::vector<GroupUsage> now = d.engine().Usage();
  for (size_t g = 0; g < now.size(); ++g) EXPECT_EQ(now[g].free_pages, empty[g].free_pages);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

// A front-end (indexer-cli bench --transport ring) killed with SIGKILL
// while it holds a ring and an open step: the step rolls back and, after
// the lease, the ring is detached and its region unmapped.
TEST(RingTest, ClientKilledHoldingARing) {
  constexpr uint64_t kLeaseMs = 500;
  Daemon d(RingConfig(kLeaseMs));
  const KilledClient k = SpawnBenchAndKill(INDEXER_CLI_PATH, d.port(), "killed", "ring", [&] {
    return d.engine().open_steps() > 0 && d.engine().num_sequences() == 2 &&
           d.service().rings() == 1;
  }, 4000);
  const pid_t pid = k.pid;
  ASSERT_TRUE(k.holding) << "the client never held a ring and an open step";
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while ((d.service().rings() > 0 || d.engine().open_steps() > 0) &&
         std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(d.service().rings(), 0u);
  EXPECT_EQ(d.engine().open_steps(), 0);
  EXPECT_EQ(d.engine().num_sequences(), 2);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  auto same = ClientAs(d.port(), "killed");
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs + 50));
  EXPECT_TRUE(same->ListRegions()->empty());
  EXPECT_FALSE(Mapped("/indexer-cli-ring-" + std::to_string(pid)));
  // The killed process never unlinked its objects.
  UnlinkShmOfKilled(pid);
}

}  // namespace
}  // namespace indexer::testing
