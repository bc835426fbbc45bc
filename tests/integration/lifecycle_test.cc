// Lifecycle through the wire (issue 13 item 6): the instance id and start
// time, ListSequences (own namespace only, paginated), the idle TTL,
// ExportEntries and the prefill -> decode hand-off between two daemons
// (identical top-k), and a sticky device error turning the daemon
// NOT_SERVING (in process; the exit status is lifecycle_process_test's).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/core/fault_injection.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

void ExpectRejected(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(text));
}

// A unary call of raw bytes on a fresh channel; the reply's bytes in *reply.
grpc::Status RawUnary(int port, const std::string& method, const std::string& bytes,
                      std::string* reply = nullptr) {
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                             grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (reply != nullptr && status.ok()) {
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    reply->clear();
    for (const auto& sl : slices) reply->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  return status;
}

// grpc.health.v1.Health/Check: 1 SERVING, 2 NOT_SERVING, -1 when it fails.
int HealthStatus(int port) {
  std::string bytes;
  if (!RawUnary(port, "/grpc.health.v1.Health/Check", "", &bytes).ok()) return -1;
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

std::unique_ptr<IndexerClient> ClientAs(int port, const std::string& id) {
  client::ClientOptions o;
  o.client_id = id;
  auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(port), o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Three layer groups, every path: fp8 dense with a candidate set, MXFP4
// tiled at r = 4, MXFP4 block layers.
config::ServerConfig HandOffConfig() {
  return MakeConfig({{.format = "fp8", .page_entries = 16, .num_layers = 3, .pages = 256,
                      .cand_block = 4, .cand_topk_blocks = 4},
                     {.format = "mxfp4", .page_entries = 16, .compress_ratio = 4, .tiled = true,
                      .num_layers = 2, .pages = 256},
                     {.format = "mxfp4", .page_entries = 16, .num_layers = 1, .heads = 2,
                      .pages = 256, .block_topk = 3}});
}

TEST(LifecycleTest, InstanceIdIsNewAtEveryStartWithTheStartTime) {
  const int64_t before = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  Daemon a(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}}));
  Daemon b(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}}));
  const int64_t after = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  auto ia = a.client().GetServerInfo();
  auto ib = b.client().GetServerInfo();
  ASSERT_TRUE(ia.ok() && ib.ok());
  EXPECT_EQ(ia->instance_id().size(), 32u);
  EXPECT_EQ(ia->instance_id().find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(ia->instance_id(), ib->instance_id());
  EXPECT_GE(ia->start_time_unix_ms(), before);
  EXPECT_LE(ia->start_time_unix_ms(), after);
  // Stable for the life of the process.
  EXPECT_EQ(a.client().GetServerInfo()->instance_id(), ia->instance_id());
  EXPECT_THAT(std::vector<std::string>(ia->features().begin(), ia->features().end()),
              ::testing::IsSupersetOf({"list_sequences", "export"}));
}

TEST(LifecycleTest, ListSequencesShowsOnlyTheCallersOwnPageByPage) {
  Daemon d(HandOffConfig());
  auto a = ClientAs(d.port(), "tenant-a");
  auto b = ClientAs(d.port(), "tenant-b");
  Shadow sa(d.layers(), 1), sb(d.layers(), 2), sanon(d.layers(), 3);
  WireStep(d, sa, {{"x", 40}, {"y", 3}, {"z", 17}}, Form::kFloat, a.get());
  WireStep(d, sb, {{"x", 5}}, Form::kFloat, b.get());
  WireStep(d, sanon, {{"w", 9}}, Form::kFloat);
  // A numeric id beside the names.
  {
    v1::WriteEntriesRequest w;
    *w.mutable_id() = client::NumericSequenceId(7);
    w.set_create(true);
    w.set_num_tokens(8);
    std::vector<LayerData> data = sa.MakeEntries({{"n7", 8}});
    for (size_t li = 0; li < d.layers().size(); ++li) {
      v1::LayerEntries* le = w.add_layers();
      le->set_layer(d.layers()[li].layer);
      *le->mutable_k() = client::MakeByteTensor(
          v1::UINT8, data[li].k_quant, {data[li].n_new, d.layers()[li].layout.entry_bytes()});
    }
    ASSERT_TRUE(a->WriteEntries(w).ok());
  }

  auto all = a->ListSequences();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->next_page_token(), "");
  std::set<std::string> names;
  for (const v1::SequenceInfo& s : all->sequences()) {
    names.insert(client::SequenceIdString(s.id()));
    const uint64_t want_len = s.id().has_name() ? sa.len(s.id().name()) : 8;
    EXPECT_EQ(s.length(), want_len) << client::SequenceIdString(s.id());
    ASSERT_EQ(s.pages_size(), 3);
    // g0: r = 1, 16 entries a page; g1: r = 4.
    EXPECT_EQ(s.pages(0), (want_len + 15) / 16);
    EXPECT_EQ(s.pages(1), (want_len / 4 + 15) / 16);
    EXPECT_FALSE(s.busy());
    EXPECT_LT(s.idle_ms(), 600000u);
  }
  EXPECT_EQ(names, (std::set<std::string>{"\"x\"", "\"y\"", "\"z\"", "7"}));

  auto other = b->ListSequences();
  ASSERT_TRUE(other.ok());
  ASSERT_EQ(other->sequences_size(), 1);
  EXPECT_EQ(other->sequences(0).id().name(), "x");
  EXPECT_EQ(other->sequences(0).length(), 5u);
  auto anon = d.client().ListSequences();
  ASSERT_TRUE(anon.ok());
  ASSERT_EQ(anon->sequences_size(), 1);
  EXPECT_EQ(anon->sequences(0).id().name(), "w");

  // Pages of 3: every sequence exactly once, in the same order.
  std::vector<std::string> paged;
  std::string token;
  int pages = 0;
  do {
    auto page = a->ListSequences(3, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->sequences_size(), 3);
    for (const auto& s : page->sequences()) paged.push_back(client::SequenceIdString(s.id()));
    token = page->next_page_token();
    ++pages;
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 2);
  std::vector<std::string> in_one;
  for (const auto& s : all->sequences()) in_one.push_back(client::SequenceIdString(s.id()));
  EXPECT_EQ(paged, in_one);

  // Bad input names the field and changes nothing.
  ExpectRejected(a->ListSequences(10001).status(), absl::StatusCode::kInvalidArgument,
                 "page_size: expected 0..10000");
  ExpectRejected(a->ListSequences(0, "not-a-token").status(), absl::StatusCode::kInvalidArgument,
                 "page_token: expected");
  EXPECT_EQ(d.engine().num_sequences(), 6);
}

TEST(LifecycleTest, BusySequencesShowBusy) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}}));
  Shadow shadow(d.layers(), 4);
  WireStep(d, shadow, {{"s", 20}}, Form::kFloat);
  auto step = d.client().OpenStep(Header({{"s", 1}}, shadow));
  ASSERT_TRUE(step.ok());
  std::vector<LayerData> data = shadow.Make({{"s", 1}});
  ASSERT_TRUE((*step)->RunLayer(Request(d.layers()[0], data[0], Form::kFloat)).ok());
  auto list = d.client().ListSequences();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->sequences_size(), 1);
  EXPECT_TRUE(list->sequences(0).busy());
  EXPECT_EQ(list->sequences(0).length(), 20u);  // committed tokens only
  (*step)->Abort();
}

// The TTL's rule, at times of the test's choosing: idle sequences go, one
// in an open step or being exported stays, and the counter counts.
TEST(LifecycleTest, IdleTtlReleasesIdleSequencesOnly) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
  cfg.set_sequence_idle_ttl_ms(3600000);  // the sweeper never fires in this test
  Daemon d(cfg);
  Shadow shadow(d.layers(), 5);
  WireStep(d, shadow, {{"idle", 30}, {"busy", 10}, {"exported", 12}}, Form::kFloat);
  auto export_pin = d.engine().Export(SeqName::Named("exported"));
  ASSERT_TRUE(export_pin.ok());
  auto step = d.client().OpenStep(Header({{"busy", 1}}, shadow));
  ASSERT_TRUE(step.ok());
  std::vector<LayerData> data = shadow.Make({{"busy", 1}});
  ASSERT_TRUE((*step)->RunLayer(Request(d.layers()[0], data[0], Form::kFloat)).ok());

  const auto now = Clock::now();
  EXPECT_EQ(d.engine().ReleaseIdle(now), 0);  // nothing idle for an hour yet
  EXPECT_EQ(d.engine().ReleaseIdle(now + std::chrono::hours(2)), 1);
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("idle")).ok());
  EXPECT_EQ(*d.engine().SequenceLength(SeqName::Named("busy")), 10);
  EXPECT_EQ(*d.engine().SequenceLength(SeqName::Named("exported")), 12);
  EXPECT_EQ(d.engine().idle_released(), 1);
  EXPECT_EQ(d.client().GetServerInfo()->idle_released(), 1u);
  EXPECT_EQ(d.client().GetServerInfo()->sequence_idle_ttl_ms(), 3600000u);
  // The busy sequence's step still commits.
  for (size_t li = 1; li < d.layers().size(); ++li) {
    ASSERT_TRUE((*step)->RunLayer(Request(d.layers()[li], data[li], Form::kFloat)).ok());
  }
  ASSERT_TRUE((*step)->Commit().ok());
  export_pin->reset();
  EXPECT_EQ(d.engine().ReleaseIdle(Clock::now() + std::chrono::hours(2)), 2);
  EXPECT_EQ(d.engine().num_sequences(), 0);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  auto info = d.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  for (const auto& g : info->groups()) EXPECT_EQ(g.free_pages(), g.total_pages());
}

// The daemon's own sweep: a short TTL releases an untouched sequence.
TEST(LifecycleTest, IdleTtlSweepRunsInTheDaemon) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 64}});
  cfg.set_sequence_idle_ttl_ms(100);
  Daemon d(cfg);
  Shadow shadow(d.layers(), 6);
  WireStep(d, shadow, {{"s", 20}}, Form::kFloat);
  ASSERT_TRUE(WaitFor([&] { return d.engine().num_sequences() == 0; }));
  EXPECT_EQ(d.client().GetServerInfo()->idle_released(), 1u);
  EXPECT_EQ(d.client().ListSequences()->sequences_size(), 0);
}

// Bytes that do not decode as the method's request: INVALID_ARGUMENT naming
// the type, nothing changes.
TEST(LifecycleTest, UndecodableRequestsNameTheirType) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 16}}));
  const std::string junk("\xff\xff\xff", 3);
  for (const auto& [method, type] :
       std::vector<std::pair<std::string, std::string>>{
           {"/indexer.v1.Indexer/ListSequences", "ListSequencesRequest"},
           {"/indexer.v1.Indexer/ExportEntries", "ExportEntriesRequest"}}) {
    grpc::Status s = RawUnary(d.port(), method, junk);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(s.error_message(), HasSubstr("request: expected a " + type + " message")) << method;
  }
  EXPECT_EQ(d.engine().num_sequences(), 0);
}

// Prefill on daemon A, export, import into daemon B, decode on both: the
// top-k of every layer is identical, and B's is right by the reference.
TEST(LifecycleTest, ExportImportHandOffGivesIdenticalTopk) {
  Daemon a(HandOffConfig());
  Daemon b(HandOffConfig());
  Shadow shadow(a.layers(), 7);
  WireStep(a, shadow, {{"s", 203}, {"t", 40}}, Form::kFloat);
  WireStep(a, shadow, {{"s", 1}, {"t", 1}}, Form::kNative);

  // Small messages: the export takes several.
  int messages = 0;
  uint64_t imported = 0;
  v1::ExportEntriesRequest req;
  *req.mutable_id() = client::NamedSequenceId("s");
  req.set_max_message_bytes(16 << 10);
  absl::Status exported = a.client().ExportEntries(req, [&](v1::WriteEntriesRequest& m) {
    EXPECT_LE(m.ByteSizeLong(), size_t{16} << 10);
    EXPECT_EQ(m.create(), messages == 0);
    EXPECT_EQ(m.layers_size(), static_cast<int>(a.layers().size()));
    for (const auto& le : m.layers()) EXPECT_EQ(le.k().dtype(), v1::UINT8);
    ++messages;
    auto len = b.client().WriteEntries(m);
    if (!len.ok()) return len.status();
    imported = *len;
    return absl::OkStatus();
  });
  ASSERT_TRUE(exported.ok()) << exported;
  EXPECT_GT(messages, 2);
  EXPECT_EQ(imported, 204u);
  EXPECT_TRUE(b.engine().CheckInvariants().ok()) << b.engine().CheckInvariants();
  // The pin ended with the stream: A may release it now (after the decode).

  // The same decode steps on both daemons.
  for (int step = 0; step < 3; ++step) {
    const std::vector<SeqStep> seqs = {{"s", step == 1 ? 5 : 1}};
    std::vector<LayerData> data = shadow.Make(seqs);
    auto sa = a.client().OpenStep(Header(seqs, shadow));
    auto sb = b.client().OpenStep(Header(seqs, shadow));
    ASSERT_TRUE(sa.ok() && sb.ok());
    for (size_t li = 0; li < a.layers().size(); ++li) {
      const TestLayer& t = a.layers()[li];
      auto ra = (*sa)->RunLayer(Request(t, data[li], Form::kNative));
      auto rb = (*sb)->RunLayer(Request(t, data[li], Form::kNative));
      ASSERT_TRUE(ra.ok()) << ra.status();
      ASSERT_TRUE(rb.ok()) << rb.status();
      EXPECT_EQ(ra->topk().data(), rb->topk().data()) << "layer " << t.layer << " step " << step;
      std::vector<int64_t> shape = {data[li].rows, t.topk};
      if (t.role == Role::kBlock) shape = {t.num_heads, data[li].rows, t.topk};
      auto topk = client::ReadInt32Tensor(rb->topk(), shape, "topk");
      ASSERT_TRUE(topk.ok()) << topk.status();
      shadow.Check(li, seqs, data[li], topk->data());
    }
    ASSERT_TRUE((*sa)->Commit().ok());
    ASSERT_TRUE((*sb)->Commit().ok());
    shadow.Commit(seqs, data);
  }
  // The copy helper: t into B in one call (the daemon's message limit).
  auto copied = a.client().CopySequence(client::NamedSequenceId("t"), b.client());
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, 41u);
  EXPECT_TRUE(a.client().Release({client::NamedSequenceId("s")}).ok());
}

TEST(LifecycleTest, ExportBadInputNamesTheFieldAndChangesNothing) {
  Daemon d(HandOffConfig());
  Shadow shadow(d.layers(), 8);
  WireStep(d, shadow, {{"s", 100}}, Form::kFloat);
  auto other = ClientAs(d.port(), "someone-else");
  auto run = [&](IndexerClient& c, const v1::ExportEntriesRequest& r) {
    int n = 0;
    absl::Status s = c.ExportEntries(r, [&](v1::WriteEntriesRequest&) {
      ++n;
      return absl::OkStatus();
    });
    EXPECT_EQ(n, 0);
    return s;
  };
  v1::ExportEntriesRequest r;
  *r.mutable_id() = client::NamedSequenceId("nope");
  ExpectRejected(run(d.client(), r), absl::StatusCode::kNotFound, "id: unknown sequence \"nope\"");
  *r.mutable_id() = client::NamedSequenceId("s");
  // Another client's sequence is simply not found.
  ExpectRejected(run(*other, r), absl::StatusCode::kNotFound, "id: unknown sequence \"s\"");
  r.set_max_message_bytes(600);
  ExpectRejected(run(d.client(), r), absl::StatusCode::kInvalidArgument,
                 "max_message_bytes: one token's entries");
  r.set_max_message_bytes(uint64_t{1} << 40);
  ExpectRejected(run(d.client(), r), absl::StatusCode::kInvalidArgument,
                 "max_message_bytes: expected 0..");
  r.set_max_message_bytes(0);
  r.set_max_tokens(1 << 20);
  ExpectRejected(run(d.client(), r), absl::StatusCode::kInvalidArgument,
                 "max_tokens: expected 0..4096");
  v1::ExportEntriesRequest empty;
  ExpectRejected(run(d.client(), empty), absl::StatusCode::kInvalidArgument, "id: expected num or name to be set");
  EXPECT_EQ(*d.engine().SequenceLength(SeqName::Named("s")), 100);
  // Nothing stays pinned: the sequence can be released.
  EXPECT_TRUE(d.client().Release({client::NamedSequenceId("s")}).ok());
  EXPECT_TRUE(d.engine().CheckInvariants().ok());
}

// A sequence created by a step still open has nothing committed to export;
// the refusal leaves no trace on its pin count.
TEST(LifecycleTest, ExportOfAnUncommittedSequenceIsRefused) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}}));
  Shadow shadow(d.layers(), 12);
  const std::vector<SeqStep> seqs = {{"n", 5}};
  std::vector<LayerData> data = shadow.Make(seqs);
  auto step = d.client().OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok());
  ASSERT_TRUE((*step)->RunLayer(Request(d.layers()[0], data[0], Form::kFloat)).ok());
  for (int i = 0; i < 2; ++i) {
    auto ex = d.engine().Export(SeqName::Named("n"));
    ExpectRejected(ex.status(), absl::StatusCode::kFailedPrecondition,
                   "id: sequence \"n\" has no committed tokens yet");
  }
  ASSERT_TRUE((*step)->RunLayer(Request(d.layers()[1], data[1], Form::kFloat)).ok());
  ASSERT_TRUE((*step)->Commit().ok());
  auto pin = d.engine().Export(SeqName::Named("n"));
  ASSERT_TRUE(pin.ok()) << pin.status();
  ExpectRejected(d.client().Release({client::NamedSequenceId("n")}).status(),
                 absl::StatusCode::kFailedPrecondition, "is being exported");
  pin->reset();
  EXPECT_TRUE(d.client().Release({client::NamedSequenceId("n")}).ok());
}

// While an export streams, Release refuses the sequence; once the stream
// ends (here: cancelled by the client), the pin is gone.
TEST(LifecycleTest, ReleaseWaitsForTheExportToEnd) {
  Daemon d(HandOffConfig());
  Shadow shadow(d.layers(), 9);
  WireStep(d, shadow, {{"s", 400}}, Form::kFloat);
  v1::ExportEntriesRequest r;
  *r.mutable_id() = client::NamedSequenceId("s");
  r.set_max_tokens(1);  // 400 messages: the stream is open after the first
  absl::Status release_during;
  absl::Status s = d.client().ExportEntries(r, [&](v1::WriteEntriesRequest&) {
    release_during = d.client().Release({client::NamedSequenceId("s")}).status();
    return absl::CancelledError("test: stop after the first message");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  ExpectRejected(release_during, absl::StatusCode::kFailedPrecondition, "is being exported");
  ASSERT_TRUE(WaitFor(
      [&] { return d.client().Release({client::NamedSequenceId("s")}).ok(); }));
  EXPECT_TRUE(d.engine().CheckInvariants().ok());
}

// Every committed entry of `name` in `layer`, [entries, VB + SB] bytes.
std::string EntriesOf(Engine& e, const SeqName& name, int32_t layer) {
  const Model& m = e.model();
  const int32_t g = m.layer_group[layer];
  const GroupSpec& gs = m.groups[g];
  const int64_t n = EntriesFor(*e.SequenceLength(name), gs.compress_ratio);
  const int64_t eb = gs.layout.entry_bytes(), E = gs.layout.page_entries;
  const std::vector<int32_t> pages = *e.SequencePages(name, g);
  std::string out(static_cast<size_t>(n * eb), '\0');
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_TRUE(e.backend()
                    .ReadEntries(gs.layout, e.pool(layer), pages[i / E], static_cast<int32_t>(i % E),
                                 1, reinterpret_cast<uint8_t*>(out.data()) + i * eb)
                    .ok());
  }
  return out;
}

// indexer-cli export / import through a file, renamed on the way.
TEST(LifecycleTest, CliExportImportThroughAFile) {
  Daemon a(HandOffConfig());
  Daemon b(HandOffConfig());
  Shadow shadow(a.layers(), 11);
  WireStep(a, shadow, {{"s", 90}}, Form::kFloat);
  const char* cli = std::getenv("INDEXER_CLI") ? std::getenv("INDEXER_CLI") : INDEXER_CLI_PATH;
  const std::string file = ::testing::TempDir() + "/lifecycle_export.bin";
  const std::string export_cmd = std::string(cli) + " --addr 127.0.0.1:" +
                                 std::to_string(a.port()) + " export --name s --out " + file +
                                 " --max-message-kb 8 > /dev/null";
  ASSERT_EQ(std::system(export_cmd.c_str()), 0) << export_cmd;
  const std::string import_cmd = std::string(cli) + " --addr 127.0.0.1:" +
                                 std::to_string(b.port()) + " import --in " + file +
                                 " --name copy > /dev/null";
  ASSERT_EQ(std::system(import_cmd.c_str()), 0) << import_cmd;
  EXPECT_EQ(*b.engine().SequenceLength(SeqName::Named("copy")), 90);
  for (int32_t l = 0; l < static_cast<int32_t>(a.layers().size()); ++l) {
    EXPECT_EQ(EntriesOf(a.engine(), SeqName::Named("s"), l),
              EntriesOf(b.engine(), SeqName::Named("copy"), l))
        << "layer " << l;
  }
  // A file that is not an export: refused, nothing imported.
  const std::string bad = ::testing::TempDir() + "/lifecycle_bad.bin";
  // A length of 5 (4 bytes, little-endian), then 3 bytes: a cut message.
  const std::string cut("\x05\x00\x00\x00" "abc", 7);
  std::ofstream(bad, std::ios::binary) << cut;
  const std::string bad_cmd = std::string(cli) + " --addr 127.0.0.1:" +
                              std::to_string(b.port()) + " import --in " + bad + " 2>/dev/null";
  EXPECT_NE(std::system(bad_cmd.c_str()), 0);
  EXPECT_EQ(b.engine().num_sequences(), 1);
  std::remove(file.c_str());
  std::remove(bad.c_str());
}

// A sticky device error (injected): the failing step rolls back, health
// turns NOT_SERVING, the owner is told once, and new work is refused.
TEST(LifecycleTest, StickyDeviceErrorTurnsNotServing) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
  auto model = BuildModel(cfg);
  ASSERT_TRUE(model.ok());
  std::vector<TestLayer> layers = TestLayers(*model);
  // Two layers pass (the first step), the third fails.
  auto engine = Engine::Create(*std::move(model),
                               MakeFaultInjectingBackend(std::make_unique<CpuBackend>(2), 2));
  ASSERT_TRUE(engine.ok());
  auto server = StartServer(*std::move(engine), "127.0.0.1:0");
  ASSERT_TRUE(server.ok());
  std::mutex mu;
  int told = 0;
  std::string why;
  (*server)->OnDeviceError([&](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    ++told;
    why = std::string(s.message());
  });
  const int port = (*server)->port();
  auto c = ClientAs(port, "");
  Shadow shadow(layers, 10);
  EXPECT_EQ(HealthStatus(port), 1);
  {
    const std::vector<SeqStep> seqs = {{"s", 10}};
    std::vector<LayerData> data = shadow.Make(seqs);
    auto step = c->OpenStep(Header(seqs, shadow));
    ASSERT_TRUE(step.ok());
    for (size_t li = 0; li < layers.size(); ++li) {
      ASSERT_TRUE((*step)->RunLayer(Request(layers[li], data[li], Form::kFloat)).ok());
    }
    ASSERT_TRUE((*step)->Commit().ok());
    shadow.Commit(seqs, data);
  }
  const std::vector<SeqStep> seqs = {{"s", 1}};
  std::vector<LayerData> data = shadow.Make(seqs);
  auto step = c->OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok());
  auto failed = (*step)->RunLayer(Request(layers[0], data[0], Form::kFloat));
  ExpectRejected(failed.status(), absl::StatusCode::kUnavailable, "injected sticky device error");
  EXPECT_EQ(HealthStatus(port), 2);
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(told, 1);
    EXPECT_THAT(why, HasSubstr("RunLayer"));
  }
  EXPECT_TRUE((*server)->engine().device_failed());
  EXPECT_EQ((*server)->engine().device_errors(), 1);
  // Rolled back; new steps and exports are refused, naming the device.
  ASSERT_TRUE(WaitFor([&] { return (*server)->engine().open_steps() == 0; }));
  EXPECT_EQ(*(*server)->engine().SequenceLength(SeqName::Named("s")), 10);
  auto again = c->OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(again.ok());
  ExpectRejected((*again)->RunLayer(Request(layers[0], data[0], Form::kFloat)).status(),
                 absl::StatusCode::kUnavailable, "device: a sticky device error");
  ExpectRejected(c->CopySequence(client::NamedSequenceId("s"), *c).status(),
                 absl::StatusCode::kUnavailable, "sticky device error");
  // The control plane still answers.
  EXPECT_TRUE(c->GetServerInfo().ok());
}

}  // namespace
}  // namespace indexer::testing
