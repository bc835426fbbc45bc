// Metrics (server/core/metrics.h) and their HTTP endpoint
// (server/http/metrics_http.h): the registry's buckets and counts under
// concurrent updates, then a daemon on the cpu backend driven through
// committed, aborted and failed steps and quota and limit refusals, scraped
// over HTTP after each: the counters move by exactly what was done, and
// every scrape parses as Prometheus text (HELP and TYPE before a family's
// samples, cumulative buckets ending in +Inf = _count, a _sum).
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "server/core/metrics.h"
#include "server/http/metrics_http.h"
#include "tests/integration/wire_harness.h"
#include "tests/sanitized_build.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;

// ------------------------------------------------------------ registry --

TEST(MetricsRegistry, BucketsAreUpperBoundsInclusive) {
  LatencyHistogram h;
  h.Observe(10);        // le 1e-05
  h.Observe(10.5);      // le 2.5e-05
  h.Observe(2e7);       // +Inf
  h.Observe(-3);        // clamped to 0: le 1e-05
  const LatencyHistogram::Snapshot s = h.Read();
  EXPECT_EQ(s.count, 4u);
  EXPECT_EQ(s.buckets[0], 2u);
  EXPECT_EQ(s.buckets[1], 1u);
  EXPECT_EQ(s.buckets.back(), 1u);
  EXPECT_NEAR(s.sum_us, 10 + 10.5 + 2e7, 1e-3);
}

TEST(MetricsRegistry, ConcurrentUpdatesAreAllCounted) {
  Metrics m;
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&m, t] {
      for (int i = 0; i < kEach; ++i) {
        m.StepEnded(StepOutcome::kCommitted);
        m.LayerDone(LayerRoleKind::kBlock, {1.0 * t, 2, 3, 4, 5, 100.0 * (i % 7)});
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(m.steps(StepOutcome::kCommitted), uint64_t{kThreads} * kEach);
  EXPECT_EQ(m.layer(LayerRoleKind::kBlock, LayerPhase::kTotal).count, uint64_t{kThreads} * kEach);
  EXPECT_EQ(m.layer(LayerRoleKind::kDense, LayerPhase::kTotal).count, 0u);
}

TEST(MetricsRegistry, OnlyDeviceFailuresCountAsDeviceErrors) {
  Metrics m;
  m.MaybeDeviceError(absl::InternalError("kernel launch failed"));
  m.MaybeDeviceError(absl::UnavailableError("device lost"));
  m.MaybeDeviceError(absl::InvalidArgumentError("q: expected ..."));
  m.MaybeDeviceError(absl::ResourceExhaustedError("pages"));
  m.MaybeDeviceError(absl::OkStatus());
  EXPECT_EQ(m.device_errors(), 2u);
}

// The heap gauges follow what this thread allocates and frees: a live
// 48 MiB block (mmapped at glibc's default threshold: in use, never kept
// free) and 8 MiB of small blocks (heap chunks: in use while held, then
// in use no more; some may stay kept). glibc only: sanitizers replace malloc.
TEST(ProcessHeap, FollowsAllocations) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's allocator replaces glibc malloc";
  const MetricsGauges::Heap h0 = ReadProcessHeap();
  if (!h0.known) GTEST_SKIP() << "not glibc >= 2.33: mallinfo2 unavailable";
  EXPECT_GT(h0.in_use, 0);
  EXPECT_GE(h0.free_kept, 0);
  constexpr int64_t kBig = 48 << 20;
  auto* big = static_cast<volatile char*>(std::malloc(kBig));
  ASSERT_NE(big, nullptr);
  big[0] = 1;
  std::vector<void*> small;
  for (int i = 0; i < 8192; ++i) small.push_back(std::malloc(1024));
  const MetricsGauges::Heap h1 = ReadProcessHeap();
  EXPECT_GE(h1.in_use - h0.in_use, kBig + (8 << 20));
  for (void* p : small) std::free(p);
  std::free(const_cast<char*>(big));
  const MetricsGauges::Heap h2 = ReadProcessHeap();
  EXPECT_LT(h2.in_use - h0.in_use, 1 << 20);  // other threads: gtest only, idle
}

// -------------------------------------------------------- exposition --

// A scrape, parsed and checked for the text format. Samples are keyed by
// their full series text: `name{labels}`.
struct Scrape {
  std::map<std::string, double> samples;
  std::string error;  // empty = the format checks passed

  double Get(const std::string& series) const {
    auto it = samples.find(series);
    return it == samples.end() ? -1 : it->second;
  }
};

std::string FamilyOf(const std::string& name, const std::map<std::string, std::string>& types) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    absl::string_view n = name;
    if (absl::ConsumeSuffix(&n, suffix)) {
      auto it = types.find(std::string(n));
      if (it != types.end() && it->second == "histogram") return std::string(n);
    }
  }
  return name;
}

Scrape Parse(const std::string& text) {
  Scrape s;
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  // Histogram series (labels without le) -> (le, cumulative count) in order.
  std::map<std::string, std::vector<std::pair<double, double>>> buckets;
  auto fail = [&](const std::string& why) {
    if (s.error.empty()) s.error = why;
  };
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "# HELP ")) {
      helped.insert(std::string(line.substr(0, line.find(' '))));
      continue;
    }
    if (absl::ConsumePrefix(&line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line, ' ');
      if (parts.size() != 2) fail("bad TYPE line: " + std::string(line));
      if (!helped.count(parts[0])) fail("TYPE before HELP for " + parts[0]);
      if (types.count(parts[0])) fail("family declared twice: " + parts[0]);
      types[parts[0]] = parts[1];
      continue;
    }
    if (line.front() == '#') continue;
    const size_t space = line.rfind(' ');
    std::string series(line.substr(0, space));
    double value = 0;
    if (space == absl::string_view::npos || !absl::SimpleAtod(line.substr(space + 1), &value)) {
      fail("bad sample line: " + std::string(line));
      continue;
    }
    const std::string name = series.substr(0, series.find('{'));
    const std::string family = FamilyOf(name, types);
    if (!types.count(family)) fail("sample before its TYPE: " + series);
    if (s.samples.count(series)) fail("duplicate series: " + series);
    s.samples[series] = value;
    if (name == family + "_bucket") {
      const size_t le = series.find(",le=\"");
      if (le == std::string::npos) {
        fail("bucket without le: " + series);
        continue;
      }
      const std::string le_text = series.substr(le + 5, series.size() - le - 7);
      double bound = 0;
      if (le_text == "+Inf") {
        bound = std::numeric_limits<double>::infinity();
      } else if (!absl::SimpleAtod(le_text, &bound)) {
        fail("bad le: " + series);
      }
      buckets[family + series.substr(name.size(), le - name.size()) + "}"].push_back({bound, value});
    }
  }
  for (const auto& [key, bs] : buckets) {
    const std::string family = key.substr(0, key.find('{'));
    const std::string labels = key.substr(family.size());
    for (size_t i = 1; i < bs.size(); ++i) {
      if (!(bs[i].first > bs[i - 1].first)) fail("le not increasing: " + key);
      if (bs[i].second < bs[i - 1].second) fail("buckets not cumulative: " + key);
    }
    if (bs.empty() || !std::isinf(bs.back().first)) fail("no +Inf bucket: " + key);
    const double count = s.Get(family + "_count" + labels);
    if (count < 0 || count != bs.back().second) fail("+Inf != _count: " + key);
    if (s.Get(family + "_sum" + labels) < 0) fail("no _sum: " + key);
  }
  return s;
}

// ----------------------------------------------------------- endpoint --

bool WaitFor(const std::function<bool()>& cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

std::unique_ptr<IndexerClient> ClientAs(Daemon& d, const std::string& who) {
  client::ClientOptions o;
  o.client_id = who;
  auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(d.port()), o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

absl::Status HeaderStatus(IndexerClient& c, const v1::StepHeader& h) {
  auto step = c.OpenStep(h);
  return step.ok() ? (*step)->RunLayer(v1::LayerRequest()).status() : step.status();
}

class MetricsEndpoint : public ::testing::Test {
 protected:
  MetricsEndpoint() : daemon_(Config()), shadow_(daemon_.layers(), 13) {
    auto m = MetricsHttp::Start("127.0.0.1:0", &daemon_.engine());
    EXPECT_TRUE(m.ok()) << m.status();
    metrics_ = *std::move(m);
  }

  // Two groups (a dense FP8 one with a candidate set, a block one); at most
  // two open steps, one per client.
  static config::ServerConfig Config() {
    config::ServerConfig cfg = MakeConfig(
        {{.format = "fp8", .num_layers = 2, .heads = 8, .topk = 16, .pages = 64,
          .cand_block = 4, .cand_topk_blocks = 4},
         {.format = "mxfp4", .page_entries = 16, .num_layers = 1, .heads = 2, .topk = 4,
          .pages = 64, .block_topk = 2, .init_blocks = 1, .local_blocks = 1}});
    cfg.set_max_open_steps(2);
    cfg.mutable_client_quota()->set_max_open_steps(1);
    return cfg;
  }

  Scrape Get() {
    httplib::Client http("127.0.0.1", metrics_->port());
    auto res = http.Get("/metrics");
    Scrape s;
    if (!res || res->status != 200) {
      s.error = "GET /metrics failed";
      return s;
    }
    EXPECT_THAT(res->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
    s = Parse(res->body);
    EXPECT_EQ(s.error, "") << res->body;
    return s;
  }

  // Scrapes until `series` reads `want` (steps end on the server a little
  // after the client returns).
  Scrape WaitValue(const std::string& series, double want) {
    Scrape s;
    EXPECT_TRUE(WaitFor([&] {
      s = Get();
      return s.Get(series) == want;
    })) << series << " = " << s.Get(series) << ", want " << want;
    return s;
  }

  Daemon daemon_;
  Shadow shadow_;
  std::unique_ptr<MetricsHttp> metrics_;
};

constexpr char kCommitted[] = "indexer_steps_total{outcome=\"committed\"}";
constexpr char kAborted[] = "indexer_steps_total{outcome=\"aborted\"}";
constexpr char kFailed[] = "indexer_steps_total{outcome=\"failed\"}";
constexpr char kQuota[] = "indexer_admission_rejections_total{reason=\"quota\"}";
constexpr char kLimits[] = "indexer_admission_rejections_total{reason=\"limits\"}";

std::string LayerSeries(const char* what, const char* role, const char* phase) {
  return std::string("indexer_layer_duration_seconds_") + what + "{role=\"" + role +
         "\",phase=\"" + phase + "\"}";
}

TEST_F(MetricsEndpoint, CountersMoveWithSteps) {
  const Scrape s0 = Get();
  EXPECT_EQ(s0.Get(kCommitted), 0);
  EXPECT_EQ(s0.Get("indexer_sequences"), 0);
  EXPECT_EQ(s0.Get("indexer_pages_used{group=\"g0\"}"), 0);
  EXPECT_EQ(s0.Get("indexer_pages_free{group=\"g1\"}"), 64);
  EXPECT_EQ(s0.Get("indexer_info{profile=\"test\",device=\"" +
                   daemon_.engine().backend().Describe() + "\"}"),
            1);

  // Two committed steps: every layer observed once per step, per role.
  WireStep(daemon_, shadow_, {{"a", 40}, {"b", 7}}, Form::kFloat);
  WireStep(daemon_, shadow_, {{"a", 1}, {"b", 1}}, Form::kNative);
  const Scrape s1 = WaitValue(kCommitted, 2);
  for (const char* role : {"candidate_source", "candidate_consumer", "block"}) {
    for (const char* phase : {"queue", "validate", "write", "logits", "topk", "total"}) {
      EXPECT_EQ(s1.Get(LayerSeries("count", role, phase)), 2) << role << " " << phase;
    }
    EXPECT_GT(s1.Get(LayerSeries("sum", role, "total")), 0) << role;
  }
  EXPECT_EQ(s1.Get(LayerSeries("count", "dense", "total")), 0);
  EXPECT_EQ(s1.Get("indexer_sequences"), 2);
  EXPECT_GT(s1.Get("indexer_pages_used{group=\"g0\"}"), 0);
  EXPECT_EQ(s1.Get("indexer_pages_used{group=\"g0\"}") + s1.Get("indexer_pages_free{group=\"g0\"}"),
            64);
  EXPECT_GT(s1.Get("indexer_received_bytes_total"), s0.Get("indexer_received_bytes_total"));
  EXPECT_GT(s1.Get("indexer_sent_bytes_total"), s0.Get("indexer_sent_bytes_total"));
  EXPECT_EQ(s1.Get("indexer_open_steps"), 0);
  if (!kSanitized) {  // glibc's heap, as ReadProcessHeap reads it
    EXPECT_GT(s1.Get("indexer_heap_bytes{state=\"in_use\"}"), 0);
    EXPECT_GE(s1.Get("indexer_heap_bytes{state=\"free_kept\"}"), 0);
  }

  // Aborted by the client after one layer.
  {
    auto step = daemon_.client().OpenStep(Header({{"a", 1}}, shadow_));
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<LayerData> data = shadow_.Make({{"a", 1}});
    ASSERT_TRUE((*step)->RunLayer(Request(daemon_.layers()[0], data[0], Form::kFloat)).ok());
    EXPECT_EQ(Get().Get("indexer_open_steps"), 1);
    (*step)->Abort();
  }
  WaitValue(kAborted, 1);
  // Failed: a layer the daemon refuses ends the step with its error.
  absl::Status bad = HeaderStatus(daemon_.client(), Header({{"b", 1}}, shadow_));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  const Scrape s2 = WaitValue(kFailed, 1);
  EXPECT_EQ(s2.Get(kCommitted), 2);
  EXPECT_EQ(s2.Get(kAborted), 1);
  EXPECT_EQ(s2.Get(kQuota), 0);
  EXPECT_EQ(s2.Get("indexer_device_errors_total"), 0);
  EXPECT_EQ(s2.Get("indexer_pages_used{group=\"g0\"}"), s1.Get("indexer_pages_used{group=\"g0\"}"));
  daemon_.WaitIdle();

  // Refusals: x's second step by its quota, z's by max_open_steps.
  auto x = ClientAs(daemon_, "x");
  auto y = ClientAs(daemon_, "y");
  auto z = ClientAs(daemon_, "z");
  auto x1 = x->OpenStep(Header({{"x1", 2}}, shadow_));
  auto y1 = y->OpenStep(Header({{"y1", 2}}, shadow_));
  ASSERT_TRUE(x1.ok() && y1.ok());
  ASSERT_TRUE(WaitFor([&] { return daemon_.engine().open_steps() == 2; }));
  EXPECT_EQ(HeaderStatus(*x, Header({{"x2", 2}}, shadow_)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(HeaderStatus(*z, Header({{"z1", 2}}, shadow_)).code(),
            absl::StatusCode::kResourceExhausted);
  const Scrape s3 = WaitValue(kLimits, 1);
  EXPECT_EQ(s3.Get(kQuota), 1);
  EXPECT_EQ(s3.Get("indexer_open_steps"), 2);
  (*x1)->Abort();
  (*y1)->Abort();
  WaitValue(kAborted, 3);
  EXPECT_EQ(Get().Get(kFailed), 1);  // refused headers are not steps
}

TEST_F(MetricsEndpoint, ImportsAreCounted) {
  v1::WriteEntriesRequest w;
  *w.mutable_id() = client::NamedSequenceId("imp");
  w.set_create(true);
  w.set_num_tokens(3);  // no layers: refused, nothing written
  EXPECT_FALSE(daemon_.client().WriteEntries(w).ok());
  const Scrape s = WaitValue("indexer_imports_total{outcome=\"failed\"}", 1);
  EXPECT_EQ(s.Get("indexer_imports_total{outcome=\"ok\"}"), 0);
  EXPECT_GT(s.Get("indexer_received_bytes_total"), 0);
}

TEST_F(MetricsEndpoint, OtherPathsAreNotFound) {
  httplib::Client http("127.0.0.1", metrics_->port());
  auto res = http.Get("/");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
}

TEST(MetricsHttpStart, BadListenNamesTheFlag) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 8}});
  Daemon d(cfg);
  for (const char* bad : {"no-port", "127.0.0.1:70000", ":9090x"}) {
    auto m = MetricsHttp::Start(bad, &d.engine());
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_THAT(std::string(m.status().message()), HasSubstr("metrics_listen")) << bad;
  }
  // A port in use cannot be bound twice.
  auto first = MetricsHttp::Start("127.0.0.1:0", &d.engine());
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = MetricsHttp::Start("127.0.0.1:" + std::to_string((*first)->port()), &d.engine());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace indexer::testing
