// `indexer-cli demo`: random sequences through a prefill and decode steps of
// every layer, each layer's top-k checked against the client reference.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_common.h"
#include "client/reference.h"
#include "client/workload.h"
#include "kernels/common/status_macros.h"

namespace indexer::client::cli {
namespace {

// Rows checked out of `rows`: all when `limit` is 0 or enough, else `limit`
// evenly spaced ones, the last row always among them.
std::vector<int32_t> SampleRows(int32_t rows, int32_t limit) {
  std::vector<int32_t> out;
  if (limit <= 0 || rows <= limit) {
    for (int32_t r = 0; r < rows; ++r) out.push_back(r);
  } else if (limit == 1) {
    out.push_back(rows - 1);
  } else {
    for (int32_t i = 0; i < limit; ++i) {
      out.push_back(static_cast<int32_t>(static_cast<int64_t>(i) * (rows - 1) /
                                         (limit - 1)));
    }
  }
  return out;
}

// Runs fn(i) for i in [0, n) on up to hardware_concurrency threads.
template <typename Fn>
void ParallelFor(int64_t n, const Fn& fn) {
  const int64_t threads = std::min<int64_t>(
      n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&fn, n, t, threads] {
      for (int64_t i = t; i < n; i += threads) fn(i);
    });
  }
  for (std::thread& th : pool) th.join();
}

absl::Status Annotate(const absl::Status& status, const std::string& where) {
  return absl::Status(status.code(),
                      absl::StrCat(where, ": ", status.message()));
}

class Demo {
 public:
  Demo(IndexerClient* client, std::vector<LayerSpec> specs,
       const DemoFlags& flags, OwnedSequences* owned)
      : client_(client),
        specs_(specs),
        flags_(flags),
        owned_(owned),
        ref_(std::move(specs), flags.seqs),
        rng_(flags.seed) {
    const std::string tag = RunTag();
    for (int32_t s = 0; s < flags.seqs; ++s) {
      ids_.push_back(
          NamedSequenceId(absl::StrCat("indexer-cli-demo-", tag, "-", s)));
      tokens_.push_back(0);
    }
  }

  // One step: every sequence brings `q_len` tokens; `create` on the first.
  absl::Status RunStep(int32_t q_len, bool create, const char* kind);

  const AgreementReport& report() const { return report_; }
  int32_t steps() const { return steps_; }

 private:
  // Rows of the current step: sequence and token position of each.
  struct Rows {
    std::vector<int32_t> seq;
    std::vector<int64_t> pos;
    int32_t count() const { return static_cast<int32_t>(seq.size()); }
  };

  absl::Status RunLayer(StepSession& session, const LayerSpec& spec,
                        int32_t q_len, const Rows& rows, bool print_rows);
  void PrintRows(const LayerSpec& spec, const QuantizedQ& q, const Rows& rows,
                 int32_t q_len, const std::vector<int32_t>& topk);

  IndexerClient* client_;
  std::vector<LayerSpec> specs_;
  DemoFlags flags_;
  OwnedSequences* owned_;
  ReferenceIndexer ref_;
  Rng rng_;
  std::vector<v1::SequenceId> ids_;
  std::vector<int64_t> tokens_;  // tokens held (committed) per sequence
  AgreementReport report_;
  int32_t steps_ = 0;
};

absl::Status Demo::RunStep(int32_t q_len, bool create, const char* kind) {
  v1::StepHeader header;
  header.set_request_id(absl::StrCat("indexer-cli-demo-step-", steps_));
  Rows rows;
  for (size_t s = 0; s < ids_.size(); ++s) {
    v1::StepSequence* seq = header.add_sequences();
    *seq->mutable_id() = ids_[s];
    seq->set_q_len(q_len);
    seq->set_create(create);
    for (int32_t j = 0; j < q_len; ++j) {
      rows.seq.push_back(static_cast<int32_t>(s));
      rows.pos.push_back(tokens_[s] + j);
    }
  }
  std::printf("step %d (%s): %zu sequences x q_len %d = %d rows, length "
              "%" PRId64 " -> %" PRId64 "\n",
              steps_, kind, ids_.size(), q_len, rows.count(), tokens_[0],
              tokens_[0] + q_len);
  const std::string where = absl::StrCat("step ", steps_);
  absl::StatusOr<std::unique_ptr<StepSession>> session =
      client_->OpenStep(header);
  if (!session.ok()) return Annotate(session.status(), where);

  bool first = true;
  for (const LayerSpec& spec : specs_) {
    RETURN_IF_ERROR(RunLayer(**session, spec, q_len, rows, first));
    first = false;
  }
  absl::StatusOr<v1::StepCommitted> committed = (*session)->Commit();
  if (!committed.ok()) return Annotate(committed.status(), where + " commit");

  std::vector<uint64_t> expected;
  for (int64_t t : tokens_) expected.push_back(static_cast<uint64_t>(t) + q_len);
  const std::vector<uint64_t> got(committed->seq_lens().begin(),
                                  committed->seq_lens().end());
  if (got != expected) {
    return absl::InternalError(absl::StrCat(
        where, " commit: StepCommitted.seq_lens: expected [",
        absl::StrJoin(expected, ", "), "], got [", absl::StrJoin(got, ", "),
        "]"));
  }
  for (size_t s = 0; s < ids_.size(); ++s) {
    tokens_[s] += q_len;
    if (create) owned_->Add(ids_[s]);
  }
  ++steps_;
  return absl::OkStatus();
}

absl::Status Demo::RunLayer(StepSession& session, const LayerSpec& spec,
                            int32_t q_len, const Rows& rows, bool print_rows) {
  const std::string where =
      absl::StrCat("step ", steps_, " layer ", spec.layer);
  const int32_t num_seqs = static_cast<int32_t>(ids_.size());
  const int64_t d = spec.head_dim;
  const int64_t eb = spec.entry_bytes();

  // New K entries, sequences in header order; the reference keeps them.
  std::vector<int64_t> k_begin(num_seqs + 1, 0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    k_begin[s + 1] =
        k_begin[s] + NewEntries(tokens_[s], q_len, spec.compress_ratio);
  }
  std::vector<float> raw_k(static_cast<size_t>(k_begin.back() * d));
  rng_.FillNormal(absl::MakeSpan(raw_k));
  const std::vector<uint8_t> quantized = QuantizeKEntries(spec, raw_k);
  for (int32_t s = 0; s < num_seqs; ++s) {
    RETURN_IF_ERROR(ref_.Append(
        spec.layer, s,
        absl::MakeConstSpan(quantized)
            .subspan(k_begin[s] * eb, (k_begin[s + 1] - k_begin[s]) * eb)));
  }

  // Index queries and head weights.
  const int32_t num_rows = rows.count();
  std::vector<float> raw_q(static_cast<size_t>(num_rows) * spec.num_heads * d);
  rng_.FillNormal(absl::MakeSpan(raw_q));
  const std::vector<float> raw_w = RandomWeights(rng_, spec, num_rows);
  const QuantizedQ q = QuantizeQ(spec, num_rows, raw_q, raw_w);

  v1::LayerRequest request;
  request.set_layer(spec.layer);
  *request.mutable_k() =
      MakeKTensor(spec, raw_k, quantized, flags_.prequantized);
  SetQueries(spec, q, raw_q, raw_w, flags_.q_fp32, &request);
  raw_q = {};

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::LayerReply> reply = session.RunLayer(std::move(request));
  const double rtt_us = MicrosSince(start);
  if (!reply.ok()) return Annotate(reply.status(), where);
  absl::StatusOr<std::vector<int32_t>> topk = ReadInt32Tensor(
      reply->topk(), {num_rows, spec.topk}, where + " topk");
  if (!topk.ok()) return topk.status();

  // Check the sampled rows against the reference, in parallel.
  const std::vector<int32_t> sample = SampleRows(num_rows, flags_.check_rows);
  std::vector<RowVerdict> verdicts(sample.size());
  std::vector<absl::Status> errors(sample.size());
  ParallelFor(static_cast<int64_t>(sample.size()), [&](int64_t i) {
    const int32_t r = sample[i];
    const int64_t visible = VisibleEntries(rows.pos[r], spec.compress_ratio);
    absl::StatusOr<std::vector<float>> logits =
        ref_.Logits(spec.layer, rows.seq[r], q, r, visible);
    if (!logits.ok()) {
      errors[i] = logits.status();
      return;
    }
    verdicts[i] = CheckTopkRow(
        *logits, absl::MakeConstSpan(*topk).subspan(
                     static_cast<size_t>(r) * spec.topk, spec.topk));
  });
  AgreementReport layer_report;
  for (size_t i = 0; i < sample.size(); ++i) {
    RETURN_IF_ERROR(errors[i]);
    const int32_t r = sample[i];
    layer_report.Add(
        absl::StrCat(where, " row ", r, " (seq ", rows.seq[r], ", pos ",
                     rows.pos[r], ", visible ",
                     VisibleEntries(rows.pos[r], spec.compress_ratio), ")"),
        verdicts[i]);
  }
  report_.Merge(layer_report);

  const v1::LayerTimings& t = reply->timings();
  std::printf("  layer %3u %-5s H=%-2d k=%-4d r=%d: rtt %9.1f us | server "
              "%9.1f (logits %8.1f, topk %8.1f) us | %" PRId64 "/%" PRId64
              " rows agree%s\n",
              spec.layer, KvFormatName(spec.format), spec.num_heads,
              spec.topk, spec.compress_ratio, rtt_us, t.total_us(),
              t.logits_us(), t.topk_us(), layer_report.agreeing(),
              layer_report.rows(),
              sample.size() < static_cast<size_t>(num_rows)
                  ? absl::StrCat(" (sampled of ", num_rows, ")").c_str()
                  : "");
  for (const std::string& problem : layer_report.problems()) {
    std::printf("    MISMATCH %s\n", problem.c_str());
  }
  if (print_rows) PrintRows(spec, q, rows, q_len, *topk);
  return absl::OkStatus();
}

// Prints the last row of the first --rows-to-print sequences: its returned
// indices in order of reference score, the best few.
void Demo::PrintRows(const LayerSpec& spec, const QuantizedQ& q,
                     const Rows& rows, int32_t q_len,
                     const std::vector<int32_t>& topk) {
  constexpr int kShown = 8;
  const int32_t n = std::min<int32_t>(flags_.rows_to_print,
                                      static_cast<int32_t>(ids_.size()));
  for (int32_t s = 0; s < n; ++s) {
    const int32_t r = (s + 1) * q_len - 1;
    const int64_t visible = VisibleEntries(rows.pos[r], spec.compress_ratio);
    absl::StatusOr<std::vector<float>> logits =
        ref_.Logits(spec.layer, s, q, r, visible);
    if (!logits.ok()) continue;
    std::vector<int32_t> got;
    for (int32_t i = 0; i < spec.topk; ++i) {
      const int32_t idx = topk[static_cast<size_t>(r) * spec.topk + i];
      if (idx >= 0 && idx < visible) got.push_back(idx);
    }
    std::sort(got.begin(), got.end(), [&](int32_t a, int32_t b) {
      return (*logits)[a] > (*logits)[b];
    });
    std::string shown;
    for (size_t i = 0; i < got.size() && i < kShown; ++i) {
      absl::StrAppend(&shown, " ", got[i], "(",
                      absl::SixDigits((*logits)[got[i]]), ")");
    }
    std::printf("    layer %u row %d (seq %d, pos %" PRId64 ", visible %" PRId64
                "): %zu indices, best:%s%s\n",
                spec.layer, r, s, rows.pos[r], visible, got.size(),
                shown.c_str(), got.size() > kShown ? " ..." : "");
  }
}

// Prompt tokens per sequence per prefill step so that the largest layer
// request and its reply stay within `budget` bytes.
int32_t PrefillChunk(const std::vector<LayerSpec>& specs,
                     const DemoFlags& flags, int64_t budget) {
  int64_t per_token = 1;
  for (const LayerSpec& spec : specs) {
    per_token = std::max<int64_t>(
        per_token, LayerRequestBytes(spec, 1, 1, flags.q_fp32,
                                     flags.prequantized) +
                       int64_t{4} * spec.topk);
  }
  int64_t chunk = budget / (per_token * flags.seqs);
  if (flags.prefill_chunk > 0) chunk = std::min<int64_t>(chunk, flags.prefill_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(chunk, 1, flags.prompt));
}

}  // namespace

absl::StatusOr<bool> RunDemo(const GlobalFlags& flags, const DemoFlags& demo) {
  ASSIGN_OR_RETURN(std::unique_ptr<IndexerClient> client,
                   ConnectFromFlags(flags));
  ASSIGN_OR_RETURN(v1::ServerInfo info, client->GetServerInfo());
  ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, LayerSpecsFromInfo(info));
  if (specs.empty()) {
    return absl::FailedPreconditionError("server info lists no layers");
  }
  for (const LayerSpec& spec : specs) {
    // A candidate source returns the dense top-k (SPEC §5); consumers and
    // block layers need references this demo does not have.
    if (spec.role != "dense" && spec.role != "candidate_source") {
      return absl::UnimplementedError(absl::StrCat(
          "demo checks dense layers only; layer ", spec.layer, " has role '",
          spec.role, "'"));
    }
  }
  const int32_t next_n = std::max<uint32_t>(1, info.next_n());
  const int32_t chunk = PrefillChunk(specs, demo, RequestBudget(info, flags));
  std::printf("demo: profile %s on %s; %zu layers; %d sequences, prompt %d "
              "(%d tokens per prefill step), %d decode steps of q_len %d; "
              "Q %s, K %s\n",
              info.profile().c_str(), info.device().c_str(), specs.size(),
              demo.seqs, demo.prompt, chunk, demo.decode_steps, next_n,
              demo.q_fp32 ? "FP32" : "quantized",
              demo.prequantized ? "pre-quantized UINT8" : "FP32");
  for (const LayerSpec& spec : specs) {
    std::printf("  layer %3u group %-12s %s\n", spec.layer, spec.group.c_str(),
                spec.DebugString().c_str());
  }

  OwnedSequences owned(client.get());
  Demo run(client.get(), specs, demo, &owned);
  for (int32_t done = 0; done < demo.prompt; done += chunk) {
    RETURN_IF_ERROR(
        run.RunStep(std::min(chunk, demo.prompt - done), done == 0, "prefill"));
  }
  for (int32_t i = 0; i < demo.decode_steps; ++i) {
    RETURN_IF_ERROR(run.RunStep(next_n, false, "decode"));
  }
  ASSIGN_OR_RETURN(uint64_t pages, owned.ReleaseAll());
  std::printf("released %d sequences (%" PRIu64 " pages)\n", demo.seqs, pages);

  const AgreementReport& report = run.report();
  for (const std::string& problem : report.problems()) {
    std::printf("MISMATCH %s\n", problem.c_str());
  }
  std::printf("agreement: %" PRId64 "/%" PRId64
              " rows across %zu layers and %d steps: %s\n",
              report.agreeing(), report.rows(), specs.size(), run.steps(),
              report.full() ? "FULL" : "MISMATCH");
  return report.full();
}

}  // namespace indexer::client::cli
