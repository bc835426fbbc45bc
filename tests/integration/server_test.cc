// End to end: the daemon on 127.0.0.1:0 (cpu backend) driven through the
// client library, results checked against the plain reference of
// reference.h. Covers both K formats and layouts, next_n 1 and 2, chunked
// prefill, compress ratio 4, mixed steps, import, concurrent steps, and the
// wire side of bad input, cancellation and dropped clients.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "indexer/client.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/rpc/reply_wire.h"
#include "server/rpc/server.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;
namespace v1 = ::indexer::v1;
using client::IndexerClient;


struct PathCase {
  std::string format;
  bool tiled;
  int compress_ratio;
  int next_n;
  Form form;
};

class PathTest : public ::testing::TestWithParam<PathCase> {};

// Prefill, then decode steps of next_n rows, then a mixed step.
TEST_P(PathTest, PrefillDecodeMixed) {
  const PathCase& c = GetParam();
  Daemon d(MakeConfig({{.format = c.format, .page_entries = 16, .compress_ratio = c.compress_ratio,
                        .tiled = c.tiled, .num_layers = 2, .heads = 8, .topk = 16, .pages = 200}},
                      c.next_n));
  Shadow shadow(d.layers(), 99);
  WireStep(d, shadow, {{"p", 150}, {"q", 7}, {"r", 1}}, c.form);
  for (int i = 0; i < 3; ++i) {
    WireStep(d, shadow, {{"p", c.next_n}, {"q", c.next_n}, {"r", c.next_n}}, c.form);
  }
  WireStep(d, shadow, {{"q", c.next_n}, {"p", 40}, {"new", 66}, {"r", 1}}, c.form);
}

INSTANTIATE_TEST_SUITE_P(
    Paths, PathTest,
    ::testing::Values(PathCase{"fp8", false, 1, 1, Form::kFloat},
                      PathCase{"fp8", false, 1, 2, Form::kNative},
                      PathCase{"fp8", true, 4, 2, Form::kFloat},
                      PathCase{"mxfp4", false, 1, 1, Form::kNative},
                      PathCase{"mxfp4", true, 1, 2, Form::kFloat},
                      PathCase{"mxfp4", true, 4, 2, Form::kNative},
                      PathCase{"fp8", false, 4, 1, Form::kNative}),
    [](const ::testing::TestParamInfo<PathCase>& i) {
      return i.param.format + (i.param.tiled ? "_tiled" : "_linear") + "_r" +
             std::to_string(i.param.compress_ratio) + "_nextn" + std::to_string(i.param.next_n) +
             (i.param.form == Form::kFloat ? "_fp32" : "_native");
    });

// A 1 MiB logits budget cuts the prefills into chunks (700 rows of up to
// 700 entries: 2 chunks; then 500 rows of up to 1200 entries: 3 chunks).
TEST(ServerTest, ChunkedPrefillUnderLogitsBudget) {
  Daemon d(MakeConfig({{.format = "fp8", .page_entries = 64, .num_layers = 1, .heads = 4,
                        .topk = 32, .pages = 64},
                       {.format = "mxfp4", .page_entries = 64, .num_layers = 1, .heads = 4,
                        .topk = 32, .pages = 64}},
                      1, /*logits_budget_mb=*/1));
  Shadow shadow(d.layers(), 5);
  WireStep(d, shadow, {{"long", 700}, {"short", 3}}, Form::kFloat);
  WireStep(d, shadow, {{"long", 500}, {"short", 1}}, Form::kNative);
}

TEST(ServerTest, ImportThenDecode) {
  Daemon d(MakeConfig({{.format = "fp8", .compress_ratio = 1, .num_layers = 1},
                       {.format = "mxfp4", .compress_ratio = 4, .tiled = true, .num_layers = 1}}));
  Shadow shadow(d.layers(), 17);
  // Import 90 tokens of entries (pre-quantized) with WriteEntries.
  const std::vector<SeqStep> seqs = {{"imp", 90}};
  std::vector<LayerData> data = shadow.Make(seqs);
  v1::WriteEntriesRequest w;
  *w.mutable_id() = client::NamedSequenceId("imp");
  w.set_create(true);
  w.set_num_tokens(90);
  for (size_t li = 0; li < d.layers().size(); ++li) {
    const TestLayer& t = d.layers()[li];
    v1::LayerEntries* le = w.add_layers();
    le->set_layer(t.layer);
    *le->mutable_k() =
        client::MakeByteTensor(v1::UINT8, data[li].k_quant, {data[li].n_new, t.layout.entry_bytes()});
  }
  auto len = d.client().WriteEntries(w);
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(*len, 90u);
  shadow.Commit(seqs, data);
  WireStep(d, shadow, {{"imp", 1}}, Form::kFloat);
  // Importing again with create = true is refused and changes nothing.
  auto again = d.client().WriteEntries(w);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*d.engine().SequenceLength(SeqName::Named("imp")), 91);
}

class WireErrors : public ::testing::Test {
 protected:
  WireErrors()
      : d_(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 32},
                       {.format = "mxfp4", .compress_ratio = 4, .num_layers = 1, .pages = 32}})),
        shadow_(d_.layers(), 3) {}
  void SetUp() override {
    WireStep(d_, shadow_, {{"a", 30}, {"b", 2}}, Form::kFloat);
    usage_ = d_.engine().Usage();
  }
  // Status, message, and the cache exactly as after SetUp.
  void ExpectRejected(const absl::Status& s, absl::StatusCode code, const std::string& field) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
    // The daemon rolls back before it sends the status.
    EXPECT_EQ(d_.engine().open_steps(), 0);
    ExpectUnchanged();
  }
  void ExpectUnchanged() {
    d_.WaitIdle();
    EXPECT_EQ(*d_.engine().SequenceLength(SeqName::Named("a")), 30);
    EXPECT_EQ(*d_.engine().SequenceLength(SeqName::Named("b")), 2);
    const std::vector<GroupUsage> now = d_.engine().Usage();
    for (size_t g = 0; g < now.size(); ++g) EXPECT_EQ(now[g].free_pages, usage_[g].free_pages);
    EXPECT_TRUE(d_.engine().CheckInvariants().ok()) << d_.engine().CheckInvariants();
  }
  // Opens a step over {a:1, b:1} and runs layer 0 with `mutate` applied.
  absl::Status RunBadLayer(const std::function<void(v1::LayerRequest&)>& mutate) {
    const std::vector<SeqStep> seqs = {{"a", 1}, {"b", 1}};
    auto step = d_.client().OpenStep(Header(seqs, shadow_));
    if (!step.ok()) return step.status();
    std::vector<LayerData> data = shadow_.Make(seqs);
    v1::LayerRequest r = Request(d_.layers()[0], data[0], Form::kFloat);
    mutate(r);
    return (*step)->RunLayer(r).status();
  }

  Daemon d_;
  Shadow shadow_;
  std::vector<GroupUsage> usage_;
};

TEST_F(WireErrors, WrongDtype) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) { r.mutable_q()->set_dtype(v1::INT32); }),
                 absl::StatusCode::kInvalidArgument, "layer 0: q: expected");
}

TEST_F(WireErrors, ByteCountMismatch) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) { r.mutable_weights()->mutable_data()->pop_back(); }),
                 absl::StatusCode::kInvalidArgument, "weights: expected [2, 8] FP32 (64 bytes)");
}

TEST_F(WireErrors, ShapeMismatch) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) { r.mutable_k()->set_shape(0, 5); }),
                 absl::StatusCode::kInvalidArgument, "k: expected [2, 128] FP32");
}

TEST_F(WireErrors, UnknownLayer) {
  ExpectRejected(RunBadLayer([](v1::LayerRequest& r) { r.set_layer(7); }),
                 absl::StatusCode::kNotFound, "layer: unknown layer 7; expected 0..2");
}

TEST_F(WireErrors, UnknownSequence) {
  v1::StepHeader h = Header({{"a", 1}}, shadow_);
  *h.add_sequences()->mutable_id() = client::NumericSequenceId(404);
  h.mutable_sequences(1)->set_q_len(1);
  auto step = d_.client().OpenStep(h);
  absl::Status s = step.ok() ? (*step)->RunLayer(v1::LayerRequest()).status() : step.status();
  ExpectRejected(s, absl::StatusCode::kNotFound, "header.sequences[1].id: unknown sequence 404");
}

TEST_F(WireErrors, QLenZeroAndMissingId) {
  v1::StepHeader h = Header({{"a", 0}}, shadow_);
  auto step = d_.client().OpenStep(h);
  absl::Status s = step.ok() ? (*step)->RunLayer(v1::LayerRequest()).status() : step.status();
  ExpectRejected(s, absl::StatusCode::kInvalidArgument, "header.sequences[0].q_len: expected 1..");
  v1::StepHeader h2;
  h2.add_sequences()->set_q_len(1);
  auto step2 = d_.client().OpenStep(h2);
  s = step2.ok() ? (*step2)->RunLayer(v1::LayerRequest()).status() : step2.status();
  ExpectRejected(s, absl::StatusCode::kInvalidArgument, "header.sequences[0].id: expected num or name");
}

TEST_F(WireErrors, SequenceTwiceInOneStep) {
  auto step = d_.client().OpenStep(Header({{"a", 1}, {"b", 1}, {"a", 1}}, shadow_));
  absl::Status s = step.ok() ? (*step)->RunLayer(v1::LayerRequest()).status() : step.status();
  ExpectRejected(s, absl::StatusCode::kInvalidArgument, "header.sequences[2].id: sequence \"a\" appears twice");
}

TEST_F(WireErrors, SequenceInTwoOpenSteps) {
  const std::vector<SeqStep> seqs = {{"a", 1}};
  auto first = d_.client().OpenStep(Header(seqs, shadow_));
  ASSERT_TRUE(first.ok());
  std::vector<LayerData> data = shadow_.Make(seqs);
  ASSERT_TRUE((*first)->RunLayer(Request(d_.layers()[0], data[0], Form::kFloat)).ok());
  auto second = d_.client().OpenStep(Header({{"b", 1}, {"a", 1}}, shadow_));
  absl::Status s = second.ok() ? (*second)->RunLayer(v1::LayerRequest()).status() : second.status();
  (*first)->Abort();
  ExpectRejected(s, absl::StatusCode::kFailedPrecondition, "header.sequences[1].id: sequence \"a\" is in another open step");
}

TEST_F(WireErrors, PoolExhausted) {
  auto step = d_.client().OpenStep(Header({{"a", 1}, {"huge", 600}}, shadow_));
  absl::Status s = step.ok() ? (*step)->RunLayer(v1::LayerRequest()).status() : step.status();
  ExpectRejected(s, absl::StatusCode::kResourceExhausted, "pages: layer group 'g0' needs");
  EXPECT_FALSE(d_.engine().SequenceLength(SeqName::Named("huge")).ok());
}

TEST_F(WireErrors, LayerSentTwice) {
  const std::vector<SeqStep> seqs = {{"a", 1}};
  auto step = d_.client().OpenStep(Header(seqs, shadow_));
  std::vector<LayerData> data = shadow_.Make(seqs);
  ASSERT_TRUE((*step)->RunLayer(Request(d_.layers()[0], data[0], Form::kFloat)).ok());
  auto again = (*step)->RunLayer(Request(d_.layers()[0], data[0], Form::kFloat));
  ExpectRejected(again.status(), absl::StatusCode::kFailedPrecondition, "layer 0: layer: layer 0 was already sent");
}

TEST_F(WireErrors, CommitWithMissingLayers) {
  const std::vector<SeqStep> seqs = {{"a", 1}};
  auto step = d_.client().OpenStep(Header(seqs, shadow_));
  std::vector<LayerData> data = shadow_.Make(seqs);
  ASSERT_TRUE((*step)->RunLayer(Request(d_.layers()[0], data[0], Form::kFloat)).ok());
  ExpectRejected((*step)->Commit().status(), absl::StatusCode::kFailedPrecondition,
                 "commit: 2 layers not sent");
}

TEST_F(WireErrors, ClientCancelsMidStep) {
  const std::vector<SeqStep> seqs = {{"a", 64}, {"c", 20}};
  auto step = d_.client().OpenStep(Header(seqs, shadow_));
  std::vector<LayerData> data = shadow_.Make(seqs);
  ASSERT_TRUE((*step)->RunLayer(Request(d_.layers()[0], data[0], Form::kFloat)).ok());
  ASSERT_TRUE((*step)->RunLayer(Request(d_.layers()[1], data[1], Form::kNative)).ok());
  EXPECT_EQ(d_.engine().open_steps(), 1);
  (*step)->Abort();
  ExpectUnchanged();
  EXPECT_FALSE(d_.engine().SequenceLength(SeqName::Named("c")).ok());
}

// A client process killed with SIGKILL while it has a step open: the daemon
// sees the connection drop and rolls the step back.
TEST_F(WireErrors, ClientKilledMidStep) {
  const std::string addr = "127.0.0.1:" + std::to_string(d_.port());
  // The CLI built beside this test, or INDEXER_CLI where binaries moved.
  const char* cli = std::getenv("INDEXER_CLI") ? std::getenv("INDEXER_CLI") : INDEXER_CLI_PATH;
  const char* argv[] = {cli, "--addr", addr.c_str(), "bench", "--batch", "2",
                        "--context", "64", "--steps", "10000000", "--warmup", "0", nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, cli, nullptr, nullptr, const_cast<char**>(argv),
                        environ),
            0);
  // Wait until the client holds an open step (its two sequences imported).
  bool open = false;
  for (int i = 0; i < 2000 && !open; ++i) {
    open = d_.engine().num_sequences() == 4 && d_.engine().open_steps() > 0;
    if (!open) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(open) << "the client never opened a step";
  d_.WaitIdle();
  // Its committed sequences stay; the open step left nothing behind.
  EXPECT_EQ(d_.engine().num_sequences(), 4);
  EXPECT_TRUE(d_.engine().CheckInvariants().ok()) << d_.engine().CheckInvariants();
}

TEST_F(WireErrors, StreamClosedBeforeCommitRollsBack) {
  const std::vector<SeqStep> seqs = {{"a", 3}};
  auto step = d_.client().OpenStep(Header(seqs, shadow_));
  std::vector<LayerData> data = shadow_.Make(seqs);
  ASSERT_TRUE((*step)->RunLayer(Request(d_.layers()[0], data[0], Form::kFloat)).ok());
  step->reset();  // the session's destructor aborts
  ExpectUnchanged();
}

TEST_F(WireErrors, ReleaseUnknownAndBusy) {
  auto r = d_.client().Release({client::NamedSequenceId("nope")});
  ExpectRejected(r.status(), absl::StatusCode::kNotFound, "ids[0]: unknown sequence \"nope\"");
}

// V4.1-style two-level layers and MiniMax-style block layers over the wire.
TEST(ServerTest, CandidateAndBlockPaths) {
  for (int next_n : {1, 2}) {
    Daemon d(MakeConfig({{.format = "fp8", .page_entries = 16, .compress_ratio = 4, .num_layers = 3,
                          .pages = 256, .cand_block = 2, .cand_topk_blocks = 5},
                         {.format = "mxfp4", .page_entries = 16, .compress_ratio = 4,
                          .tiled = true, .num_layers = 2, .pages = 256, .cand_block = 3,
                          .cand_topk_blocks = 4},
                         {.format = "mxfp4", .page_entries = 32, .num_layers = 2, .heads = 4,
                          .pages = 256, .block_topk = 4, .init_blocks = 1, .local_blocks = 2}},
                        next_n));
    Shadow shadow(d.layers(), 11 + next_n);
    WireStep(d, shadow, {{"p", 300}, {"q", 5}}, Form::kFloat);
    for (int i = 0; i < 3; ++i) WireStep(d, shadow, {{"p", next_n}, {"q", next_n}}, Form::kNative);
    WireStep(d, shadow, {{"q", 100}, {"p", next_n}, {"n", 1}}, Form::kFloat);
    // Near-ties at the pool cut are rare on random data; such rows are still
    // checked for range and uniqueness.
    EXPECT_GT(shadow.consumer_rows(), 0);
    EXPECT_LE(shadow.ambiguous_rows() * 50, shadow.consumer_rows());
  }
}

// Steps over disjoint sequences from two threads at once.
TEST(ServerTest, ConcurrentStepsOnDifferentSequences) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 3, .pages = 256, .cand_block = 4,
                        .cand_topk_blocks = 4},
                       {.format = "mxfp4", .compress_ratio = 4, .num_layers = 2, .pages = 256},
                       {.format = "mxfp4", .page_entries = 16, .num_layers = 1, .heads = 2,
                        .pages = 256, .block_topk = 3}}));
  Shadow s1(d.layers(), 1), s2(d.layers(), 2);
  std::thread t1([&] {
    for (int i = 0; i < 6; ++i) WireStep(d, s1, {{"x", i == 0 ? 80 : 1}}, Form::kFloat);
  });
  std::thread t2([&] {
    for (int i = 0; i < 6; ++i) WireStep(d, s2, {{"y", i == 0 ? 50 : 2}}, Form::kNative);
  });
  t1.join();
  t2.join();
  EXPECT_TRUE(d.engine().CheckInvariants().ok());
}

// Draining (SIGTERM in the daemon): a step still open when the grace period
// ends is cancelled and rolled back; new calls are refused.
TEST(ServerTest, ShutdownRollsBackOpenSteps) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}}));
  Shadow shadow(d.layers(), 21);
  WireStep(d, shadow, {{"s", 40}}, Form::kFloat);
  const std::vector<SeqStep> seqs = {{"s", 1}, {"t", 5}};
  auto step = d.client().OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok());
  std::vector<LayerData> data = shadow.Make(seqs);
  ASSERT_TRUE((*step)->RunLayer(Request(d.layers()[0], data[0], Form::kFloat)).ok());
  d.Shutdown(/*grace_ms=*/100);
  EXPECT_EQ(d.engine().open_steps(), 0);
  EXPECT_EQ(*d.engine().SequenceLength(SeqName::Named("s")), 40);
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("t")).ok());
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  EXPECT_FALSE((*step)->RunLayer(Request(d.layers()[1], data[1], Form::kFloat)).ok());
  EXPECT_FALSE(d.client().GetServerInfo().ok());
}

// grpc.health.v1.Health/Check through a generic call: the response is
// HealthCheckResponse{status: SERVING (1)}, i.e. the bytes 08 01.
TEST(ServerTest, HealthCheckServing) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}}));
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(d.port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  grpc::ByteBuffer request, response;  // empty request: service ""
  grpc::Slice empty;
  request = grpc::ByteBuffer(&empty, 1);
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
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

// The hand-assembled layer reply (head + top-k bytes as their own slice)
// parses to the message protobuf would have written, at varint boundaries
// of every length in it.
TEST(ReplyWireTest, LayerReplyHeadParsesToTheReply) {
  for (size_t n : {size_t{0}, size_t{4}, size_t{124}, size_t{128}, size_t{16380}, size_t{16384},
                   size_t{524288}, size_t{3} << 21}) {
    v1::LayerReply reply;
    reply.set_layer(n == 0 ? 0 : 300);
    reply.mutable_timings()->set_total_us(12.5);
    reply.mutable_timings()->set_logits_us(n * 0.25);
    v1::Tensor meta;
    meta.set_dtype(v1::INT32);
    meta.add_shape(static_cast<int64_t>(n / 4 / 2 + (n > 0)));
    meta.add_shape(2);
    std::string data(n, '\0');
    for (size_t i = 0; i < n; ++i) data[i] = static_cast<char>(i * 7 + 1);

    v1::StepResponse expected;
    *expected.mutable_layer() = reply;
    *expected.mutable_layer()->mutable_topk() = meta;
    expected.mutable_layer()->mutable_topk()->set_data(data);

    v1::StepResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(LayerReplyHead(reply, meta, n) + data)) << n;
    EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString()) << n;
    EXPECT_EQ(parsed.layer().topk().data().size(), n);
  }
}

// Step is served on raw bytes: a message that is not a StepRequest ends the
// stream with INVALID_ARGUMENT.
TEST(ServerTest, StepRejectsBytesThatAreNotAStepRequest) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}}));
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(d.port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/indexer.v1.Indexer/Step", &cq);
  auto tag = [](intptr_t i) { return reinterpret_cast<void*>(i); };
  auto await = [&](intptr_t want) {
    void* got;
    bool ok;
    return cq.Next(&got, &ok) && got == tag(want) && ok;
  };
  call->StartCall(tag(1));
  ASSERT_TRUE(await(1));
  const std::string junk = "\x0a\xff\xff\xff";  // field 1, truncated length
  grpc::Slice slice(junk);
  call->Write(grpc::ByteBuffer(&slice, 1), tag(2));
  await(2);  // the write may fail once the server has ended the stream
  grpc::Status status;
  call->Finish(&status, tag(3));
  ASSERT_TRUE(await(3));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("StepRequest"));
  cq.Shutdown();
  void* t;
  bool ok;
  while (cq.Next(&t, &ok)) {
  }
}

TEST(ServerTest, ServerInfoDescribesTheProfile) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 10},
                       {.format = "mxfp4", .compress_ratio = 4, .tiled = true, .num_layers = 1, .pages = 12}}));
  auto info = d.client().GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->profile(), "test");
  ASSERT_EQ(info->groups_size(), 2);
  EXPECT_EQ(info->groups(0).kv_format(), "fp8");
  EXPECT_EQ(info->groups(0).entry_bytes(), 132u);
  EXPECT_EQ(info->groups(1).entry_bytes(), 68u);
  EXPECT_EQ(info->groups(1).compress_ratio(), 4u);
  EXPECT_EQ(info->groups(1).total_pages(), 12u);
  EXPECT_THAT(info->groups(1).layout(), HasSubstr("tiled"));
  ASSERT_EQ(info->layers_size(), 3);
  EXPECT_EQ(info->layers(2).role(), "dense");
  EXPECT_EQ(info->device(), d.engine().backend().Describe());
}

}  // namespace
}  // namespace indexer::testing
