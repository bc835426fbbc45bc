// Soak driver: several client threads against a running indexerd for a
// given time, each over sequences of its own, doing what serving engines and
// faulty clients do: prefill steps that create sequences, committed decode
// steps over batches of tens of sequences, aborted steps, steps whose layer
// has a wrong shape (must fail with INVALID_ARGUMENT and change nothing),
// imports (WriteEntries) and releases. Each thread keeps the lengths it
// expects and checks them against every commit and import reply, so a step
// that leaked into a sequence shows up, and checks every row of every layer
// reply against SPEC §5's shape (CheckRows). At the end everything is released
// and GetServerInfo must report every page free, no sequence and no open
// step. With --pid, the daemon's memory may grow at most --rss-growth-mb
// between the end of the warm-up (a quarter of the run) and the end, when
// every call has ended: its VmRSS, or, with --metrics-addr (the daemon's
// --metrics-listen, HOST:PORT), two measures that tell a leak from
// the freed heap glibc keeps for large messages by design
// (proto/transport_tuning.h; it follows the heaps' high-water mark), which
// counts in the RSS without being live:
//  - the live malloc heap (indexer_heap_bytes{state="in_use"}): a leak of
//    heap memory grows it;
//  - the RSS less the freed heap kept (state="free_kept"): a leak outside
//    the heap (mmap, pinned host buffers, thread stacks) grows it.
// Each is bounded by --rss-growth-mb; their baseline is the least value
// sampled (every 250 ms) from the warm-up on, so that messages in flight at
// one sampling instant do not hide growth. All three are printed. (The
// freed heap glibc reports may include pages never touched, up to its top
// pad per arena; the second measure is then a little low, never high.)
//
// Long contexts (--long-tokens N): each thread instead keeps --long-seqs
// sequences of N tokens, imported with WriteEntries in chunks of at most
// max_q_len tokens and half the message limit (--import-chunk: a smaller
// one, e.g. one that is no multiple of a page, so that imports append at
// odd offsets), and runs committed, aborted and bad-layer decode steps over
// them, releasing the oldest now and then and importing a fresh one, as an
// engine serving long prompts from a prefix cache does. Their K carries
// needles: three entries per sequence and layer (one in the first eighth,
// one in the middle third, one in the last eighth of the context, at the
// same token positions in every layer) equal to 16 u for a random unit
// direction u, the rest N(0, 1) noise; every query row is u. A needle then
// scores 16 where noise scores N(0, 1) (below 6 over a million entries), so
// every needle a row sees must be in its top-k (its block, in every head,
// for a block layer; pools take their blocks): a value check that holds
// whatever the context length, where a page table, an import offset or a
// gather that lost an entry of the far past shows up. Now and then a
// sequence is handed over: exported (ExportEntries) and imported under a
// new name, every exported entry of its imported prefix compared with the
// bytes the thread sent (the cache holds exactly them), the copy stepped
// like the others. After a failed import (a full pool) ListSequences must
// show the sequence as it was before.
//
// Impatient clients (--impatient N): N more threads that do the same, but
// through clients whose Step streams and unary calls give up after 0.3 to
// 100 ms (one call in seven through a patient one, so that they hold
// sequences), as an engine's timed-out requests do: calls are cancelled
// while the daemon works on them. Every timed-out step is reconciled
// (ListSequences, once none of its sequences is in an open step): each
// sequence as before, or, when the deadline struck during the commit,
// every one grown by its q_len; never part of a batch. A timed-out import
// may apply after the client gave up (the daemon runs a call whose
// deadline passed in transit), so its sequence leaves the working set and
// is checked 2 s later: as before or grown by the import, nothing else.
// Such late calls also hold a sequence in a step for a moment; an
// impatient thread that finds one "in an open step" waits and tries again.
//
// Usage: soak_driver --addr HOST:PORT --seconds N [--threads 4] [--pid PID]
//                    [--rss-growth-mb 64] [--metrics-addr HOST:PORT] [--seed 1]
//                    [--long-tokens 0] [--long-seqs 4] [--import-chunk 0]
//                    [--impatient 0]
// Exit status 0 when every check held. tests/soak/soak.sh runs it.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "httplib.h"
#include "client/reference.h"
#include "kernels/geometry/step_geometry.h"
#include "client/workload.h"
#include "indexer/client.h"
#include "kernels/common/status_macros.h"
#include "tests/soak/needles.h"

namespace indexer::soak {
namespace {

using client::IndexerClient;
using client::LayerSpec;
using client::Rng;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string addr = "127.0.0.1:50061";
  double seconds = 60;
  int threads = 4;
  long pid = 0;
  double rss_growth_mb = 64;
  std::string metrics_addr;  // the daemon's metrics endpoint, HOST:PORT; empty: RSS only
  uint64_t seed = 1;
  int64_t long_tokens = 0;  // 0: short sequences (the default mix)
  int long_seqs = 4;
  int64_t import_chunk = 0;  // 0: as large as max_q_len and the message limit allow
  int impatient = 0;  // more threads whose steps and imports have deadlines of 0.3-100 ms
};

// What the daemon accepts per call (ServerInfo).
struct Limits {
  int64_t max_q_len = 65536;
  int64_t max_message_bytes = int64_t{64} << 20;
};

// Operation counts over all threads.
struct Counts {
  std::atomic<long> prefill{0}, decode{0}, aborted{0}, bad_layer{0}, imports{0},
      releases{0}, full{0}, decode_seqs{0}, layers_checked{0}, needles_found{0},
      imported_tokens{0}, copies{0}, entries_compared{0}, failed_imports_checked{0},
      timeouts{0}, timeouts_applied{0}, impatient_commits{0}, late_steps{0};
};

long RssKb(long pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// The daemon's memory at one moment (bytes; -1 where unknown).
struct Memory {
  double rss = -1;
  double heap_in_use = -1;   // indexer_heap_bytes{state="in_use"}
  double heap_free = -1;     // indexer_heap_bytes{state="free_kept"}
  bool heap_known() const { return heap_in_use >= 0 && heap_free >= 0; }
  double rss_less_free() const { return rss - heap_free; }
};

Memory ReadMemory(const Options& opt) {
  Memory m;
  const long kb = RssKb(opt.pid);
  if (kb >= 0) m.rss = kb * 1024.0;
  if (opt.metrics_addr.empty()) return m;
  httplib::Client http("http://" + opt.metrics_addr);
  http.set_connection_timeout(2, 0);
  http.set_read_timeout(5, 0);
  auto res = http.Get("/metrics");
  if (!res || res->status != 200) return m;
  for (absl::string_view line : absl::StrSplit(res->body, '\n')) {
    double* into = nullptr;
    if (absl::ConsumePrefix(&line, "indexer_heap_bytes{state=\"in_use\"} ")) into = &m.heap_in_use;
    else if (absl::ConsumePrefix(&line, "indexer_heap_bytes{state=\"free_kept\"} ")) into = &m.heap_free;
    double v;
    if (into != nullptr && absl::SimpleAtod(line, &v)) *into = v;
  }
  return m;
}

// ReadMemory, tried up to five times 200 ms apart until the heap figures
// come (with --metrics-addr; without, once).
Memory ReadMemoryRetrying(const Options& opt) {
  Memory m = ReadMemory(opt);
  for (int i = 1; i < 5 && !opt.metrics_addr.empty() && !m.heap_known(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    m = ReadMemory(opt);
  }
  return m;
}

class Worker {
 public:
  Worker(int id, const Options& opt, std::vector<LayerSpec> specs, uint32_t next_n,
         const Limits& limits, bool impatient, Counts* counts)
      : id_(id), opt_(opt), specs_(std::move(specs)), next_n_(next_n), limits_(limits),
        impatient_(impatient), counts_(counts), rng_(opt.seed * 1000 + id),
        field_(opt.seed * 1000 + id + 500) {}

  // Runs until `deadline`; returns the first failure.
  absl::Status Run(Clock::time_point deadline) {
    auto c = IndexerClient::Connect(opt_.addr);
    if (!c.ok()) return c.status();
    client_ = *std::move(c);
    if (impatient_) {
      // Clients whose Step streams and unary calls give up after 0.3 to
      // 100 ms: many steps and imports die mid-flight, cancelled while the
      // daemon works on them, as an engine's timed-out requests do.
      for (double ms : {0.3, 1.0, 3.0, 10.0, 30.0, 100.0}) {
        client::ClientOptions o;
        o.step_timeout = absl::Microseconds(ms * 1000);
        o.rpc_timeout = absl::Microseconds(ms * 1000);
        o.abort_grace = absl::Microseconds(ms * 1000);
        auto h = IndexerClient::Connect(opt_.addr, o);
        if (!h.ok()) return h.status();
        hasty_.push_back(*std::move(h));
      }
    }
    if (opt_.long_tokens > 0) return RunLong(deadline);
    while (Clock::now() < deadline) {
      const uint64_t r = rng_.Next() % 100;
      absl::Status s;
      if (seqs_.size() < 12 || r < 12) {
        s = Prefill();
      } else if (r < 78) {
        s = DecodeMix(r);
      } else if (r < 90) {
        s = Import();
      } else {
        s = ReleaseSome(1 + rng_.Next() % 3);
      }
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        // The pool or the admission limit is full (other threads hold it):
        // make room, as an engine evicting sequences would.
        ++counts_->full;
        s = ReleaseSome(std::max<size_t>(1, seqs_.size() / 3));
      }
      if (!s.ok()) return s;
      // Keep each thread's working set bounded.
      if (seqs_.size() > 48) RETURN_IF_ERROR(ReleaseSome(8));
      RETURN_IF_ERROR(ResolveRetired(false));
    }
    RETURN_IF_ERROR(ResolveRetired(true));
    return ReleaseSome(seqs_.size());
  }

 private:
  enum class StepEnd { kCommit, kAbort, kBadLayer };
  struct Seq {
    std::string name;
    int64_t len;
    // Long mode: needle token positions and the noise's salt of the
    // --long-tokens tokens imported at creation (whose bytes the thread
    // knows; a handover's copy keeps its original's).
    std::vector<int64_t> needles = {};
    uint64_t salt = 0;
  };

  int64_t Between(int64_t lo, int64_t hi) { return lo + rng_.Next() % (hi - lo + 1); }

  v1::Tensor Floats(std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    rng_.FillNormal(absl::MakeSpan(v));
    return client::MakeFp32Tensor(v, shape);
  }

  // FP32 K for `seqs` each growing by its q_len, FP32 Q and weights.
  v1::LayerRequest Layer(const LayerSpec& spec, const std::vector<Seq*>& seqs,
                         const std::vector<int64_t>& q_lens, int64_t extra_rows = 0) {
    int64_t rows = 0, n_new = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      rows += q_lens[i];
      n_new += NewEntriesFor(seqs[i]->len, q_lens[i], spec.compress_ratio);
    }
    rows += extra_rows;
    v1::LayerRequest r;
    r.set_layer(spec.layer);
    *r.mutable_k() = Floats({n_new, spec.head_dim});
    *r.mutable_q() =
        long_mode() ? field_.Queries(spec, rows) : Floats({rows, spec.num_heads, spec.head_dim});
    if (!spec.is_block()) {
      std::vector<float> w(rows * spec.num_heads, 1.0f / spec.num_heads);
      *r.mutable_weights() = client::MakeFp32Tensor(w, {rows, spec.num_heads});
    }
    return r;
  }

  // The client of a step or an import: the thread's own, or for an
  // impatient thread one of its hasty clients or (one call in seven, so
  // that it holds sequences to step) its own.
  IndexerClient& CallClient() {
    if (!impatient_) return *client_;
    const size_t i = rng_.Next() % (hasty_.size() + 1);
    return i < hasty_.size() ? *hasty_[i] : *client_;
  }

  static bool TimedOut(const absl::Status& s) {
    return s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kCancelled;
  }

  // Runs one step (StepOnce). A step of an impatient thread that timed out
  // is reconciled: the daemon must hold each sequence as before, or (when
  // the deadline struck during the commit) every sequence of the batch
  // grown by its q_len; never a mix, never anything else.
  //
  // A timed-out step's header may still reach the daemon's executor after
  // the client reconciled (the call's deadline passed in transit): the
  // daemon then opens the step and rolls it back when it finds the stream
  // cancelled. Meanwhile the sequences are busy, so an impatient thread
  // whose next step or release finds them "in an open step" waits until
  // they are free (at most 30 s) and tries again, up to 3 times.
  absl::Status Step(std::vector<Seq*> seqs, std::vector<int64_t> q_lens,
                    std::vector<bool> create, StepEnd end) {
    for (int attempt = 0;; ++attempt) {
      bool committing = false;
      absl::Status s = StepOnce(seqs, q_lens, create, end, &committing);
      if (s.ok() && impatient_ && committing) ++counts_->impatient_commits;
      if (s.ok() || !impatient_) return s;
      if (TimedOut(s)) {
        ++counts_->timeouts;
        return Reconcile(seqs, q_lens, committing,
                         absl::StrCat("step ", steps_, " (", s.message(), ")"));
      }
      if (!InOpenStep(s) || attempt == 3) return s;
      ++counts_->late_steps;
      RETURN_IF_ERROR(Settled(seqs, "a late step").status());
    }
  }

  static bool InOpenStep(const absl::Status& s) {
    return s.code() == absl::StatusCode::kFailedPrecondition &&
           absl::StrContains(s.message(), "open step");
  }

  // Waits until none of `seqs` is in an open step (polling ListSequences),
  // then returns their lengths; a sequence not listed is absent.
  absl::StatusOr<std::map<std::string, int64_t>> Settled(const std::vector<Seq*>& seqs,
                                                         const std::string& what) {
    const auto give_up = Clock::now() + std::chrono::seconds(30);
    while (true) {
      std::map<std::string, int64_t> held;
      bool busy = false;
      std::string token;
      do {
        ASSIGN_OR_RETURN(v1::ListSequencesResponse page, client_->ListSequences(0, token));
        for (const v1::SequenceInfo& info : page.sequences()) {
          for (const Seq* q : seqs) {
            if (info.id().name() != q->name) continue;
            held[q->name] = static_cast<int64_t>(info.length());
            busy = busy || info.busy();
          }
        }
        token = page.next_page_token();
      } while (!token.empty());
      if (!busy) return held;
      if (Clock::now() > give_up) {
        return absl::InternalError(
            absl::StrCat(what, ": its sequences are still in an open step after 30 s"));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  // After a call that timed out: waits until none of `seqs` is in an open
  // step (a cancelled step is rolled back after the client left), then
  // takes the daemon's lengths (ListSequences; a sequence not listed holds
  // 0). All must be as before, or with `may_have_applied` all grown by
  // their `adds`; updates the lengths to what the daemon holds.
  absl::Status Reconcile(const std::vector<Seq*>& seqs, const std::vector<int64_t>& adds,
                         bool may_have_applied, const std::string& what) {
    ASSIGN_OR_RETURN(const auto held, Settled(seqs, what));
    size_t applied = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto it = held.find(seqs[i]->name);
      const int64_t now = it == held.end() ? 0 : it->second;
      if (now == seqs[i]->len + adds[i] && adds[i] > 0 && may_have_applied) {
        ++applied;
      } else if (now != seqs[i]->len) {
        return absl::InternalError(absl::StrCat(
            what, ": ", seqs[i]->name, " holds ", now, " tokens, expected ", seqs[i]->len,
            may_have_applied ? absl::StrCat(" or ", seqs[i]->len + adds[i]) : ""));
      }
    }
    if (applied != 0 && applied != seqs.size()) {
      return absl::InternalError(absl::StrCat(what, ": ", applied, " of ", seqs.size(),
                                              " sequences grew: a commit applied in part"));
    }
    if (applied != 0) {
      for (size_t i = 0; i < seqs.size(); ++i) seqs[i]->len += adds[i];
      ++counts_->timeouts_applied;
    }
    return absl::OkStatus();
  }

  absl::Status StepOnce(const std::vector<Seq*>& seqs, const std::vector<int64_t>& q_lens,
                        const std::vector<bool>& create, StepEnd end, bool* committing) {
    v1::StepHeader h;
    h.set_request_id(absl::StrCat("soak-", id_, "-", ++steps_));
    std::vector<int64_t> old_tokens;  // the rows' bounds, per layer, come from these
    for (size_t i = 0; i < seqs.size(); ++i) {
      old_tokens.push_back(seqs[i]->len);
      v1::StepSequence* s = h.add_sequences();
      *s->mutable_id() = client::NamedSequenceId(seqs[i]->name);
      s->set_q_len(q_lens[i]);
      s->set_create(create[i]);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<client::StepSession> step, CallClient().OpenStep(h));
    // Aborted steps stop after 0..L-1 layers; a bad layer is any layer.
    size_t stop_after = specs_.size();
    if (end == StepEnd::kAbort) stop_after = rng_.Next() % specs_.size();
    if (end == StepEnd::kBadLayer) stop_after = 1 + rng_.Next() % specs_.size();
    for (size_t li = 0; li < stop_after; ++li) {
      const LayerSpec& spec = specs_[li];
      const bool bad = end == StepEnd::kBadLayer && li == stop_after - 1;
      auto reply = step->RunLayer(Layer(spec, seqs, q_lens, bad ? 1 : 0));
      if (bad) {
        // Header errors (a full pool; an impatient thread's late step, see
        // Step) reach the client at its first layer; an impatient client's
        // deadline may strike first.
        if (!reply.ok() && (reply.status().code() == absl::StatusCode::kResourceExhausted ||
                            (impatient_ && (TimedOut(reply.status()) ||
                                            InOpenStep(reply.status()))))) {
          return reply.status();
        }
        if (reply.ok() || reply.status().code() != absl::StatusCode::kInvalidArgument) {
          return absl::InternalError(absl::StrCat(
              "layer ", spec.layer, " with one row too many: expected INVALID_ARGUMENT, got ",
              reply.ok() ? "OK" : reply.status().ToString()));
        }
        ++counts_->bad_layer;
        return absl::OkStatus();
      }
      if (!reply.ok()) {
        return absl::Status(reply.status().code(),
                            absl::StrCat("layer ", spec.layer, ": ", reply.status().message()));
      }
      const std::vector<int64_t> bounds = client::ReplyRowBounds(spec, old_tokens, q_lens);
      ASSIGN_OR_RETURN(std::vector<int32_t> topk,
                       client::ReadInt32Tensor(reply->topk(),
                                               spec.ReplyShape(static_cast<int64_t>(bounds.size())),
                                               "topk"));
      RETURN_IF_ERROR(CheckRows(spec, bounds, topk));
      if (long_mode()) RETURN_IF_ERROR(CheckNeedles(spec, seqs, q_lens, bounds, topk));
    }
    if (end == StepEnd::kAbort) {
      step->Abort();
      ++counts_->aborted;
      // A hasty client's abort may end in a cancel before the daemon rolled
      // the step back: wait for that, and check it changed nothing.
      if (impatient_) return Reconcile(seqs, q_lens, false, absl::StrCat("aborted step ", steps_));
      return absl::OkStatus();
    }
    *committing = true;
    ASSIGN_OR_RETURN(v1::StepCommitted committed, step->Commit());
    if (committed.seq_lens_size() != static_cast<int>(seqs.size())) {
      return absl::InternalError(absl::StrCat("commit: ", committed.seq_lens_size(),
                                              " lengths for ", seqs.size(), " sequences"));
    }
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i]->len += q_lens[i];
      if (committed.seq_lens(i) != static_cast<uint64_t>(seqs[i]->len)) {
        return absl::InternalError(absl::StrCat("commit: ", seqs[i]->name, " has length ",
                                                committed.seq_lens(i), ", expected ",
                                                seqs[i]->len));
      }
    }
    return absl::OkStatus();
  }

  // SPEC §5's shape of every row of a layer's reply (client::CheckReplyShape;
  // `bounds` per row, client::ReplyRowBounds): values are the needles' job
  // in the long mode, the reference tests' otherwise.
  absl::Status CheckRows(const LayerSpec& spec, const std::vector<int64_t>& bounds,
                         const std::vector<int32_t>& topk) {
    const client::RowVerdict v = client::CheckReplyShape(spec, bounds, topk);
    if (!v.ok) {
      return absl::InternalError(
          absl::StrCat("layer ", spec.layer, " (", spec.role, ") of step ", steps_, ": ", v.problem));
    }
    ++counts_->layers_checked;
    return absl::OkStatus();
  }

  // ---- long contexts (--long-tokens) ----
  bool long_mode() const { return opt_.long_tokens > 0; }

  absl::Status RunLong(Clock::time_point deadline) {
    int full_in_a_row = 0;
    while (Clock::now() < deadline) {
      const uint64_t r = rng_.Next() % 100;
      absl::Status s;
      if (seqs_.size() < static_cast<size_t>(opt_.long_seqs)) {
        s = ImportLong();
      } else if (r < 78) {
        s = DecodeMix(r);
      } else if (r < 86) {
        s = CopyLong();
        // Back to --long-seqs: the oldest goes.
        if (s.ok() && seqs_.size() > static_cast<size_t>(opt_.long_seqs)) s = ReleaseSome(1);
      } else {
        s = ReleaseSome(1);  // the oldest; a fresh one is imported next
      }
      if (s.code() == absl::StatusCode::kResourceExhausted) {
        ++counts_->full;
        if (++full_in_a_row > 1000) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "the pool was full 1000 times in a row: a cache this size cannot hold ",
              opt_.threads, " threads' sequences of ", opt_.long_tokens, " tokens"));
        }
        // Other threads hold the pool: wait for them to turn over.
        if (seqs_.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        s = ReleaseSome(std::max<size_t>(1, seqs_.size() / 2));
      } else if (s.ok()) {
        full_in_a_row = 0;
      }
      if (!s.ok()) return s;
    }
    return ReleaseSome(seqs_.size());
  }

  // A fresh sequence of --long-tokens tokens by WriteEntries, in chunks of
  // at most max_q_len tokens and (at most 16 MiB of) half the message limit,
  // or --import-chunk. A failed chunk releases what the sequence holds.
  absl::Status ImportLong() {
    const int64_t len = opt_.long_tokens;
    Seq s{absl::StrCat("soak-", id_, "-", ++names_), 0};
    s.needles = PlaceNeedles(rng_, len, NeedlesPerSeq(specs_));
    int64_t chunk = client::ImportChunkTokens(
        specs_, limits_.max_q_len, std::min<int64_t>(limits_.max_message_bytes / 2, int64_t{16} << 20));
    if (opt_.import_chunk > 0) chunk = std::min(chunk, opt_.import_chunk);
    s.salt = rng_.Next();
    while (s.len < len) {
      const int64_t n = std::min(chunk, len - s.len);
      v1::WriteEntriesRequest req;
      *req.mutable_id() = client::NamedSequenceId(s.name);
      req.set_create(s.len == 0);
      req.set_num_tokens(n);
      for (const LayerSpec& spec : specs_) {
        v1::LayerEntries* e = req.add_layers();
        e->set_layer(spec.layer);
        const std::vector<uint8_t> bytes =
            field_.Entries(spec, EntriesFor(s.len, spec.compress_ratio),
                        NewEntriesFor(s.len, n, spec.compress_ratio), s.needles, s.salt);
        *e->mutable_k() = client::MakeKTensor(spec, {}, bytes, true);
      }
      absl::StatusOr<uint64_t> got = client_->WriteEntries(req);
      if (!got.ok()) {
        // A failed import adds nothing: the sequence keeps what it held.
        RETURN_IF_ERROR(CheckHeldThenRelease(s));
        return got.status();
      }
      s.len += n;
      counts_->imported_tokens += n;
      if (*got != static_cast<uint64_t>(s.len)) {
        return absl::InternalError(
            absl::StrCat("import: ", s.name, " has length ", *got, ", expected ", s.len));
      }
    }
    seqs_.push_back(std::move(s));
    ++counts_->imports;
    return absl::OkStatus();
  }

  // The length the daemon holds for `s` (ListSequences) must be s.len (not
  // listed at all when 0: a failed first import creates nothing); then `s`
  // is released. For a sequence whose last import failed.
  absl::Status CheckHeldThenRelease(Seq& s) {
    ASSIGN_OR_RETURN(const auto listed, Settled({&s}, "a failed import"));
    const int64_t held = listed.empty() ? -1 : listed.begin()->second;
    if (s.len == 0 ? held != -1 : held != s.len) {
      return absl::InternalError(absl::StrCat(
          "after a failed import ", s.name, held < 0 ? " is not listed" : " holds ",
          held < 0 ? "" : absl::StrCat(held, " tokens"), ", expected ",
          s.len == 0 ? "no sequence" : absl::StrCat(s.len, " tokens (what it held before)")));
    }
    ++counts_->failed_imports_checked;
    if (s.len == 0) return absl::OkStatus();
    ASSIGN_OR_RETURN(uint64_t pages, client_->Release({client::NamedSequenceId(s.name)}));
    (void)pages;
    return absl::OkStatus();
  }

  // A handover: one of the thread's sequences exported (ExportEntries) and
  // imported under a new name, as between two daemons (here the same one).
  // Every exported entry of the imported prefix must be the bytes the
  // thread imported, whatever steps ran since: the cache holds exactly
  // them. The copy then joins the thread's sequences (and its needles).
  absl::Status CopyLong() {
    const Seq from = seqs_[rng_.Next() % seqs_.size()];
    Seq copy{absl::StrCat("soak-", id_, "-", ++names_), 0, from.needles, from.salt};
    v1::ExportEntriesRequest req;
    *req.mutable_id() = client::NamedSequenceId(from.name);
    req.set_max_message_bytes(std::min<int64_t>(limits_.max_message_bytes, int64_t{16} << 20));
    absl::Status s = client_->ExportEntries(req, [&](v1::WriteEntriesRequest& m) -> absl::Status {
      if (m.layers_size() != static_cast<int>(specs_.size())) {
        return absl::InternalError(absl::StrCat("export of ", from.name, ": ", m.layers_size(),
                                                " layers in a message, expected ", specs_.size()));
      }
      const int64_t pos = copy.len;
      for (size_t li = 0; li < specs_.size(); ++li) {
        const LayerSpec& spec = specs_[li];
        const v1::LayerEntries& layer = m.layers(static_cast<int>(li));
        const int64_t eb = spec.entry_bytes();
        const int64_t first = EntriesFor(pos, spec.compress_ratio);
        const int64_t n = NewEntriesFor(pos, static_cast<int64_t>(m.num_tokens()), spec.compress_ratio);
        if (layer.layer() != spec.layer || static_cast<int64_t>(layer.k().data().size()) != n * eb) {
          return absl::InternalError(absl::StrCat(
              "export of ", from.name, " at token ", pos, ": layer ", layer.layer(), " with ",
              layer.k().data().size(), " bytes, expected layer ", spec.layer, " with ", n * eb));
        }
        const int64_t known = std::clamp<int64_t>(
            EntriesFor(opt_.long_tokens, spec.compress_ratio) - first, 0, n);
        if (known == 0) continue;
        const std::vector<uint8_t> want = field_.Entries(spec, first, known, from.needles, from.salt);
        const auto* got = reinterpret_cast<const uint8_t*>(layer.k().data().data());
        for (int64_t i = 0; i < known; ++i) {
          if (!std::equal(want.begin() + i * eb, want.begin() + (i + 1) * eb, got + i * eb)) {
            return absl::InternalError(absl::StrCat("export of ", from.name, ": layer ", spec.layer,
                                                    " entry ", first + i,
                                                    " differs from the bytes imported"));
          }
        }
        counts_->entries_compared += known;
      }
      *m.mutable_id() = client::NamedSequenceId(copy.name);
      ASSIGN_OR_RETURN(uint64_t len, client_->WriteEntries(m));
      copy.len = pos + static_cast<int64_t>(m.num_tokens());
      if (len != static_cast<uint64_t>(copy.len)) {
        return absl::InternalError(
            absl::StrCat("import of ", copy.name, ": length ", len, ", expected ", copy.len));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) {
      RETURN_IF_ERROR(CheckHeldThenRelease(copy));
      return s;
    }
    if (copy.len != from.len) {
      return absl::InternalError(absl::StrCat("copy of ", from.name, " (", from.len,
                                              " tokens) holds ", copy.len));
    }
    seqs_.push_back(std::move(copy));
    ++counts_->copies;
    return absl::OkStatus();
  }

  // Every needle a row of this step sees is in its top-k (needles.h).
  absl::Status CheckNeedles(const LayerSpec& spec, const std::vector<Seq*>& seqs,
                            const std::vector<int64_t>& q_lens, const std::vector<int64_t>& bounds,
                            const std::vector<int32_t>& topk) {
    std::vector<std::vector<int64_t>> needles;
    std::vector<std::string> names;
    for (const Seq* q : seqs) {
      needles.push_back(q->needles);
      names.push_back(q->name);
    }
    int64_t found = 0;
    absl::Status s = soak::CheckNeedles(spec, bounds, q_lens, needles, names, topk, &found);
    counts_->needles_found += found;
    if (!s.ok()) return absl::InternalError(absl::StrCat("step ", steps_, ": ", s.message()));
    return absl::OkStatus();
  }

  absl::Status Prefill() {
    const int n = static_cast<int>(Between(2, 4));
    std::vector<Seq> fresh;
    for (int i = 0; i < n; ++i) fresh.push_back({absl::StrCat("soak-", id_, "-", ++names_), 0});
    std::vector<Seq*> ptrs;
    std::vector<int64_t> q_lens;
    for (Seq& s : fresh) {
      ptrs.push_back(&s);
      q_lens.push_back(Between(next_n_ + 1, 96));
    }
    RETURN_IF_ERROR(Step(ptrs, q_lens, std::vector<bool>(n, true), StepEnd::kCommit));
    if (fresh[0].len == 0) return absl::OkStatus();  // timed out and rolled back
    for (Seq& s : fresh) seqs_.push_back(s);
    ++counts_->prefill;
    return absl::OkStatus();
  }

  // The decode mix of both modes, for r in [0, 78): committed below 60,
  // aborted below 70, else a step with a bad layer.
  absl::Status DecodeMix(uint64_t r) {
    return Decode(r < 60 ? StepEnd::kCommit : r < 70 ? StepEnd::kAbort : StepEnd::kBadLayer);
  }

  // A batch of 10..40 of this thread's sequences (all when fewer).
  absl::Status Decode(StepEnd end) {
    std::vector<Seq*> batch;
    for (Seq& s : seqs_) batch.push_back(&s);
    for (size_t i = batch.size(); i > 1; --i) std::swap(batch[i - 1], batch[rng_.Next() % i]);
    batch.resize(std::min<size_t>(batch.size(), Between(10, 40)));
    std::vector<int64_t> q_lens;
    for (size_t i = 0; i < batch.size(); ++i) q_lens.push_back(Between(1, next_n_));
    RETURN_IF_ERROR(Step(batch, q_lens, std::vector<bool>(batch.size(), false), end));
    if (end == StepEnd::kCommit) {
      ++counts_->decode;
      counts_->decode_seqs += static_cast<long>(batch.size());
    }
    return absl::OkStatus();
  }

  absl::Status Import() {
    const bool create = seqs_.empty() || rng_.Next() % 3 == 0;
    Seq fresh{absl::StrCat("soak-", id_, "-", ++names_), 0};
    Seq* s = create ? &fresh : &seqs_[rng_.Next() % seqs_.size()];
    const int64_t n = Between(1, 64);
    v1::WriteEntriesRequest req;
    *req.mutable_id() = client::NamedSequenceId(s->name);
    req.set_create(create);
    req.set_num_tokens(n);
    for (const LayerSpec& spec : specs_) {
      v1::LayerEntries* e = req.add_layers();
      e->set_layer(spec.layer);
      *e->mutable_k() =
          Floats({NewEntriesFor(s->len, n, spec.compress_ratio), spec.head_dim});
    }
    absl::StatusOr<uint64_t> got = CallClient().WriteEntries(req);
    for (int attempt = 0; impatient_ && !create && InOpenStep(got.status()) && attempt < 3;
         ++attempt) {
      ++counts_->late_steps;  // as in Step
      RETURN_IF_ERROR(Settled({s}, "import").status());
      got = CallClient().WriteEntries(req);
    }
    if (impatient_ && TimedOut(got.status())) {
      // The import may have happened, or may still happen: the daemon runs
      // a call whose deadline passed in transit (its check of the call's
      // cancellation comes first). The sequence leaves the working set and
      // is checked once that call must have ended (ResolveRetired).
      ++counts_->timeouts;
      retired_.push_back({*s, n, Clock::now()});
      if (!create) seqs_.erase(seqs_.begin() + (s - seqs_.data()));
      return absl::OkStatus();
    }
    if (!got.ok()) return got.status();
    const uint64_t len = *got;
    s->len += n;
    counts_->imported_tokens += n;
    if (len != static_cast<uint64_t>(s->len)) {
      return absl::InternalError(
          absl::StrCat("import: ", s->name, " has length ", len, ", expected ", s->len));
    }
    if (create) seqs_.push_back(fresh);
    ++counts_->imports;
    return absl::OkStatus();
  }

  // Sequences of timed-out imports whose calls have had kRetireGrace to end
  // (all of them, waiting, with `all`): each must hold what it held before
  // or that plus the import, never anything else; then it is released.
  // The grace assumes the daemon runs a queued call within 2 s or not at all.
  absl::Status ResolveRetired(bool all) {
    constexpr auto kRetireGrace = std::chrono::seconds(2);
    while (!retired_.empty()) {
      const auto ready = retired_.front().since + kRetireGrace;
      if (Clock::now() < ready) {
        if (!all) return absl::OkStatus();
        std::this_thread::sleep_until(ready);
      }
      Seq s = retired_.front().seq;
      const int64_t add = retired_.front().add;
      retired_.erase(retired_.begin());
      const int64_t before = s.len;
      RETURN_IF_ERROR(Reconcile({&s}, {add}, true, absl::StrCat("a timed-out import of ", s.name)));
      if (s.len != before) ++counts_->timeouts_applied;
      if (s.len == 0) continue;  // a first import that never ran: nothing to release
      seqs_.push_back(s);        // released with the working set's oldest
      std::rotate(seqs_.begin(), seqs_.end() - 1, seqs_.end());
      RETURN_IF_ERROR(ReleaseSome(1));
    }
    return absl::OkStatus();
  }

  absl::Status ReleaseSome(size_t n) {
    n = std::min(n, seqs_.size());
    if (n == 0) return absl::OkStatus();
    std::vector<v1::SequenceId> ids;
    std::vector<Seq*> ptrs;
    for (size_t i = 0; i < n; ++i) {
      ids.push_back(client::NamedSequenceId(seqs_[i].name));
      ptrs.push_back(&seqs_[i]);
    }
    absl::StatusOr<uint64_t> pages = client_->Release(ids);
    // An impatient thread's late step (Step) may hold them for a moment.
    for (int attempt = 0; impatient_ && !pages.ok() && InOpenStep(pages.status()) && attempt < 3;
         ++attempt) {
      ++counts_->late_steps;
      RETURN_IF_ERROR(Settled(ptrs, "release").status());
      pages = client_->Release(ids);
    }
    if (!pages.ok()) return pages.status();
    if (*pages == 0) return absl::InternalError("release: 0 pages returned for held sequences");
    seqs_.erase(seqs_.begin(), seqs_.begin() + static_cast<long>(n));
    ++counts_->releases;
    return absl::OkStatus();
  }

  const int id_;
  const Options& opt_;
  const std::vector<LayerSpec> specs_;
  const uint32_t next_n_;
  const Limits limits_;
  const bool impatient_;
  Counts* counts_;
  Rng rng_;
  std::unique_ptr<IndexerClient> client_;
  std::vector<std::unique_ptr<IndexerClient>> hasty_;  // impatient threads' clients
  struct Retired {
    Seq seq;  // as before the import
    int64_t add;
    Clock::time_point since;
  };
  std::vector<Retired> retired_;  // timed-out imports, oldest first
  std::vector<Seq> seqs_;
  long names_ = 0, steps_ = 0;
  NeedleField field_;  // long mode: the needles, the noise, the query direction
};

absl::Status CheckDrained(IndexerClient& c) {
  // Steps end asynchronously on the server after a client's abort: poll.
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (true) {
    ASSIGN_OR_RETURN(v1::ServerInfo info, c.GetServerInfo());
    std::string bad;
    if (info.open_steps() != 0) absl::StrAppend(&bad, " open_steps ", info.open_steps(), ";");
    if (info.sequences() != 0) absl::StrAppend(&bad, " sequences ", info.sequences(), ";");
    for (const auto& g : info.groups()) {
      if (g.free_pages() != g.total_pages()) {
        absl::StrAppend(&bad, " group ", g.name(), " free ", g.free_pages(), " of ",
                        g.total_pages(), ";");
      }
    }
    if (bad.empty()) return absl::OkStatus();
    if (Clock::now() > deadline) {
      return absl::InternalError(absl::StrCat("after releasing everything:", bad));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

int Main(const Options& opt) {
  auto c = IndexerClient::Connect(opt.addr);
  if (!c.ok()) {
    std::fprintf(stderr, "soak: connect %s: %s\n", opt.addr.c_str(), c.status().ToString().c_str());
    return 1;
  }
  auto info = (*c)->GetServerInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "soak: GetServerInfo: %s\n", info.status().ToString().c_str());
    return 1;
  }
  auto specs = client::LayerSpecsFromInfo(*info);
  if (!specs.ok()) {
    std::fprintf(stderr, "soak: %s\n", specs.status().ToString().c_str());
    return 1;
  }
  Limits limits;
  if (info->max_q_len() > 0) limits.max_q_len = info->max_q_len();
  if (info->max_message_bytes() > 0) limits.max_message_bytes = info->max_message_bytes();
  std::printf("soak: %s, profile %s on %s, %d threads (+%d impatient), %.0f s\n", opt.addr.c_str(),
              info->profile().c_str(), info->device().c_str(), opt.threads, opt.impatient,
              opt.seconds);
  if (opt.long_tokens > 0) {
    std::printf("soak: long contexts: %d sequences of %lld tokens per thread, needles checked\n",
                opt.long_seqs, static_cast<long long>(opt.long_tokens));
  }
  std::fflush(stdout);

  Counts counts;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::milliseconds(static_cast<long>(opt.seconds * 1000));
  std::vector<absl::Status> results(opt.threads);
  std::vector<std::thread> threads;
  const int workers = opt.threads + opt.impatient;
  results.resize(workers);
  for (int t = 0; t < workers; ++t) {
    threads.emplace_back([&, t] {
      Worker w(t, opt, *specs, info->next_n(), limits, t >= opt.threads, &counts);
      results[t] = w.Run(deadline);
    });
  }
  // The memory after warm-up: a quarter of the run (pools, arenas and
  // gRPC's buffers have reached their working size by then); then the least
  // of each heap measure until the workers end.
  // A sample whose scrape failed (a busy daemon past the client's
  // timeout) is left out and counted; the warm-up and end samples are
  // tried up to five times and must succeed.
  Memory warm_mem, least;
  long samples = 0, samples_missed = 0;
  if (opt.pid > 0) {
    const auto warm = start + (deadline - start) / 4;
    while (Clock::now() < warm) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    warm_mem = least = ReadMemoryRetrying(opt);
    while (Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      const Memory m = ReadMemory(opt);
      if (!m.heap_known() || m.rss < 0) {
        ++samples_missed;
        continue;
      }
      ++samples;
      least.heap_in_use = std::min(least.heap_in_use, m.heap_in_use);
      if (m.rss_less_free() < least.rss_less_free()) {
        least.rss = m.rss;
        least.heap_free = m.heap_free;
      }
    }
  }
  for (auto& th : threads) th.join();
  int failures = 0;
  for (int t = 0; t < workers; ++t) {
    if (!results[t].ok()) {
      std::fprintf(stderr, "soak: thread %d: %s\n", t, results[t].ToString().c_str());
      ++failures;
    }
  }
  std::printf(
      "soak: %.0f s: %ld prefill, %ld committed decode (%ld sequence-steps), %ld aborted, "
      "%ld bad-layer, %ld imports (%ld tokens), %ld releases, %ld pool-full; %ld layer replies "
      "checked row by row%s\n",
      std::chrono::duration<double>(Clock::now() - start).count(), counts.prefill.load(),
      counts.decode.load(), counts.decode_seqs.load(), counts.aborted.load(),
      counts.bad_layer.load(), counts.imports.load(), counts.imported_tokens.load(),
      counts.releases.load(), counts.full.load(), counts.layers_checked.load(),
      opt.long_tokens > 0
          ? absl::StrCat(", ", counts.needles_found.load(), " needles found; ",
                         counts.copies.load(), " handovers (", counts.entries_compared.load(),
                         " exported entries equal to those imported); ",
                         counts.failed_imports_checked.load(),
                         " failed imports that changed nothing")
                .c_str()
          : "");
  if (opt.impatient > 0) {
    std::printf("soak: %d impatient clients: %ld steps committed in time; %ld steps and imports "
                "timed out (%ld of them applied whole), each reconciled; %ld calls found a late "
                "step and waited\n",
                opt.impatient, counts.impatient_commits.load(), counts.timeouts.load(),
                counts.timeouts_applied.load(), counts.late_steps.load());
  }
  if (absl::Status s = CheckDrained(**c); !s.ok()) {
    std::fprintf(stderr, "soak: %s\n", s.ToString().c_str());
    ++failures;
  } else {
    std::printf("soak: drained: every page free, 0 sequences, 0 open steps\n");
  }
  if (counts.decode.load() == 0 || (opt.long_tokens == 0 && counts.prefill.load() == 0)) {
    std::fprintf(stderr, "soak: no committed step ran\n");
    ++failures;
  }
  if (opt.long_tokens > 0 && counts.needles_found.load() == 0) {
    std::fprintf(stderr, "soak: long contexts, but no needle was checked\n");
    ++failures;
  }
  if (opt.pid > 0) {
    constexpr double kMB = 1 << 20;
    const Memory end = ReadMemoryRetrying(opt);
    const double rss_growth = (end.rss - warm_mem.rss) / kMB;
    std::printf("soak: daemon VmRSS %.1f MB after warm-up, %.1f MB at the end (%+.1f MB)\n",
                warm_mem.rss / kMB, end.rss / kMB, rss_growth);
    auto bound = [&](const char* what, double growth_mb) {
      if (growth_mb <= opt.rss_growth_mb) return;
      std::fprintf(stderr, "soak: daemon %s grew %.1f MB after warm-up (bound %.0f MB)\n", what,
                   growth_mb, opt.rss_growth_mb);
      ++failures;
    };
    if (warm_mem.rss < 0 || end.rss < 0) {
      std::fprintf(stderr, "soak: cannot read VmRSS of pid %ld\n", opt.pid);
      ++failures;
    } else if (opt.metrics_addr.empty()) {
      std::printf("soak: RSS growth bound %.0f MB\n", opt.rss_growth_mb);
      bound("RSS", rss_growth);
    } else if (!warm_mem.heap_known() || !end.heap_known()) {
      std::fprintf(stderr,
                   "soak: no indexer_heap_bytes from %s in five tries (a "
                   "daemon not on glibc, a sanitizer's allocator, or no endpoint there)\n",
                   opt.metrics_addr.c_str());
      ++failures;
    } else {
      const double live = (end.heap_in_use - least.heap_in_use) / kMB;
      const double resident = (end.rss_less_free() - least.rss_less_free()) / kMB;
      std::printf(
          "soak: daemon heap in use %.1f MB at least after warm-up, %.1f MB at the end (%+.1f "
          "MB); freed heap kept %.1f -> %.1f MB; RSS less the kept heap %.1f MB at least, "
          "%.1f MB at the end (%+.1f MB); bound %.0f MB on each (%ld samples, %ld scrapes "
          "missed)\n",
          least.heap_in_use / kMB, end.heap_in_use / kMB, live, warm_mem.heap_free / kMB,
          end.heap_free / kMB, least.rss_less_free() / kMB, end.rss_less_free() / kMB, resident,
          opt.rss_growth_mb, samples, samples_missed);
      bound("live heap", live);
      bound("RSS less the freed heap kept", resident);
    }
  }
  std::printf("soak: %s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace indexer::soak

int main(int argc, char** argv) {
  indexer::soak::Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "soak: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--addr") opt.addr = next();
    else if (a == "--seconds") opt.seconds = std::stod(next());
    else if (a == "--threads") opt.threads = std::stoi(next());
    else if (a == "--pid") opt.pid = std::stol(next());
    else if (a == "--rss-growth-mb") opt.rss_growth_mb = std::stod(next());
    else if (a == "--metrics-addr") opt.metrics_addr = next();
    else if (a == "--seed") opt.seed = std::stoull(next());
    else if (a == "--long-tokens") opt.long_tokens = std::stoll(next());
    else if (a == "--long-seqs") opt.long_seqs = std::stoi(next());
    else if (a == "--import-chunk") opt.import_chunk = std::stoll(next());
    else if (a == "--impatient") opt.impatient = std::stoi(next());
    else {
      std::fprintf(stderr,
                   "usage: soak_driver --addr HOST:PORT --seconds N [--threads 4] [--pid PID] "
                   "[--rss-growth-mb 64] [--metrics-addr HOST:PORT] [--seed 1] [--long-tokens 0] [--long-seqs 4] "
                   "[--import-chunk 0] [--impatient 0]\n");
      return 2;
    }
  }
  if (opt.long_tokens != 0 && (opt.long_tokens < 1024 || opt.long_seqs < 1)) {
    std::fprintf(stderr, "soak: --long-tokens: expected 0 or at least 1024, --long-seqs at least 1\n");
    return 2;
  }
  return indexer::soak::Main(opt);
}
