// `indexer-cli demo`: random sequences through a prefill and decode steps of
// every layer, each layer's top-k checked against the client reference:
// dense layers and candidate sources by the SPEC §5 rule, consumers by the
// rule restricted to the pools the reference derives from the source's
// logits of the same step, block layers per (head, row) over block scores.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <set>
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

// Short role name for the latency lines.
const char* RoleTag(const LayerSpec& spec) {
  if (spec.is_source()) return "source";
  if (spec.is_consumer()) return "consumer";
  if (spec.is_block()) return "block";
  return "dense";
}

class Demo {
 public:
  Demo(IndexerClient* client, std::vector<LayerSpec> specs,
       const DemoFlags& flags, BlockQFormat block_q, OwnedSequences* owned)
      : client_(client),
        specs_(specs),
        flags_(flags),
        block_q_(block_q),
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

  // Creates the sequences with `tokens` tokens each through WriteEntries
  // (random K, kept by the reference; nothing to check), in requests of at
  // most `budget` bytes.
  absl::Status Import(int64_t tokens, int64_t budget);
  // One step: every sequence brings `q_len` tokens; `create` on the first.
  absl::Status RunStep(int32_t q_len, bool create, const char* kind);

  const AgreementReport& report() const { return report_; }
  int32_t steps() const { return steps_; }
  // Checked source rows whose pool cut was within tolerance (their
  // consumers are checked against bounds of the pool), the blocks near those
  // cuts, and all checked source rows.
  int64_t ambiguous_pools() const { return ambiguous_pools_; }
  int64_t maybe_blocks() const { return maybe_blocks_; }
  int64_t source_rows() const { return source_rows_; }

 private:
  // Rows of the current step: sequence and token position of each.
  struct Rows {
    std::vector<int32_t> seq;
    std::vector<int64_t> pos;
    int32_t count() const { return static_cast<int32_t>(seq.size()); }
  };
  // The queries of one layer as the reference needs them.
  struct Queries {
    QuantizedQ token;          // dense and candidate layers
    std::vector<float> block;  // block layers: [rows, Hi, D] as scored
  };

  absl::Status RunLayer(StepSession& session, const LayerSpec& spec,
                        int32_t q_len, const Rows& rows, bool print_rows);
  // Checks the sampled rows of a dense or candidate layer; a source keeps
  // its rows' pool bounds in pools_ for its consumers.
  absl::Status CheckTokenLayer(const LayerSpec& spec, const Queries& q,
                               const Rows& rows,
                               const std::vector<int32_t>& sample,
                               const std::vector<int32_t>& topk,
                               AgreementReport& report);
  // Checks every head of the sampled rows of a block layer.
  absl::Status CheckBlockLayer(const LayerSpec& spec, const Queries& q,
                               const Rows& rows,
                               const std::vector<int32_t>& sample,
                               const std::vector<int32_t>& topk,
                               AgreementReport& report);
  std::string RowLabel(const LayerSpec& spec, const Rows& rows,
                       int32_t r) const;
  // Reference scores of row r (head 0 of a block layer) and its returned
  // indices, for printing.
  void PrintRows(const LayerSpec& spec, const Queries& q, const Rows& rows,
                 int32_t q_len, const std::vector<int32_t>& topk);

  IndexerClient* client_;
  std::vector<LayerSpec> specs_;
  DemoFlags flags_;
  BlockQFormat block_q_;
  OwnedSequences* owned_;
  ReferenceIndexer ref_;
  Rng rng_;
  std::vector<v1::SequenceId> ids_;
  std::vector<int64_t> tokens_;  // tokens held (committed) per sequence
  AgreementReport report_;
  int32_t steps_ = 0;
  // This step's pools: source layer -> bounds per sampled row (the sample
  // is the same for every layer of a step).
  std::map<uint32_t, std::vector<PoolBounds>> pools_;
  int64_t ambiguous_pools_ = 0;
  int64_t maybe_blocks_ = 0;
  int64_t source_rows_ = 0;
};

absl::Status Demo::Import(int64_t tokens, int64_t budget) {
  int64_t bytes_per_token = 1;
  for (const LayerSpec& spec : specs_) {
    bytes_per_token += spec.entry_bytes() / spec.compress_ratio + 1;
  }
  const int64_t chunk = std::max<int64_t>(
      1, std::min<int64_t>(budget, 32 << 20) / bytes_per_token);
  ProgressLine progress;
  for (size_t s = 0; s < ids_.size(); ++s) {
    while (tokens_[s] < tokens) {
      const int64_t n = std::min<int64_t>(chunk, tokens - tokens_[s]);
      v1::WriteEntriesRequest request;
      *request.mutable_id() = ids_[s];
      request.set_create(tokens_[s] == 0);
      request.set_num_tokens(n);
      for (const LayerSpec& spec : specs_) {
        std::vector<float> raw(static_cast<size_t>(
            NewEntriesFor(tokens_[s], n, spec.compress_ratio) * spec.head_dim));
        rng_.FillNormal(absl::MakeSpan(raw));
        const std::vector<uint8_t> linear = QuantizeKEntries(spec, raw);
        RETURN_IF_ERROR(
            ref_.Append(spec.layer, static_cast<int32_t>(s), linear));
        v1::LayerEntries* layer = request.add_layers();
        layer->set_layer(spec.layer);
        *layer->mutable_k() = MakeKTensor(spec, raw, linear, true);
      }
      absl::StatusOr<uint64_t> len = client_->WriteEntries(request);
      if (!len.ok()) {
        return Annotate(len.status(), absl::StrCat("import of sequence ", s));
      }
      if (request.create()) owned_->Add(ids_[s]);
      tokens_[s] += n;
      if (*len != static_cast<uint64_t>(tokens_[s])) {
        return absl::InternalError(absl::StrCat(
            "WriteEntries seq_len: expected ", tokens_[s], ", got ", *len));
      }
      progress.Update(absl::StrCat("  import: sequence ", s + 1, "/",
                                   ids_.size(), ", ", tokens_[s], "/", tokens,
                                   " tokens"));
    }
  }
  progress.Done();
  std::printf("imported %zu sequences x %" PRId64 " tokens (WriteEntries)\n",
              ids_.size(), tokens);
  return absl::OkStatus();
}

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

  // Layer order: every source runs before its consumers (LayerSpecsFromInfo
  // checked that sources come first).
  pools_.clear();
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
        k_begin[s] + NewEntriesFor(tokens_[s], q_len, spec.compress_ratio);
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

  // Index queries: head weights too, except for block layers.
  const int32_t num_rows = rows.count();
  v1::LayerRequest request;
  request.set_layer(spec.layer);
  *request.mutable_k() =
      MakeKTensor(spec, raw_k, quantized, flags_.prequantized);
  Queries q;
  {
    std::vector<float> raw_q(static_cast<size_t>(num_rows) * spec.num_heads *
                             d);
    rng_.FillNormal(absl::MakeSpan(raw_q));
    if (spec.is_block()) {
      q.block = SetBlockQueries(spec, num_rows, raw_q, block_q_, &request);
    } else {
      const std::vector<float> raw_w = RandomWeights(rng_, spec, num_rows);
      q.token = QuantizeQ(spec, num_rows, raw_q, raw_w);
      SetQueries(spec, q.token, raw_q, raw_w, flags_.q_fp32, &request);
    }
  }

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<v1::LayerReply> reply = session.RunLayer(std::move(request));
  const double rtt_us = MicrosSince(start);
  if (!reply.ok()) return Annotate(reply.status(), where);
  absl::StatusOr<std::vector<int32_t>> topk = ReadInt32Tensor(
      reply->topk(), spec.ReplyShape(num_rows), where + " topk");
  if (!topk.ok()) return topk.status();

  const std::vector<int32_t> sample = SampleRows(num_rows, flags_.check_rows);
  AgreementReport layer_report;
  RETURN_IF_ERROR(spec.is_block()
                      ? CheckBlockLayer(spec, q, rows, sample, *topk,
                                        layer_report)
                      : CheckTokenLayer(spec, q, rows, sample, *topk,
                                        layer_report));
  report_.Merge(layer_report);

  const v1::LayerTimings& t = reply->timings();
  std::printf("  layer %3u %-8s %-5s H=%-2d k=%-4d r=%d: rtt %9.1f us | "
              "server %9.1f (logits %8.1f, topk %8.1f) us | %" PRId64
              "/%" PRId64 " %s agree%s\n",
              spec.layer, RoleTag(spec), KvFormatName(spec.format),
              spec.num_heads, spec.topk, spec.compress_ratio, rtt_us,
              t.total_us(), t.logits_us(), t.topk_us(),
              layer_report.agreeing(), layer_report.rows(),
              spec.is_block() ? "head-rows" : "rows",
              sample.size() < static_cast<size_t>(num_rows)
                  ? absl::StrCat(" (sampled of ", num_rows, ")").c_str()
                  : "");
  for (const std::string& problem : layer_report.problems()) {
    std::printf("    MISMATCH %s\n", problem.c_str());
  }
  if (print_rows) PrintRows(spec, q, rows, q_len, *topk);
  return absl::OkStatus();
}

std::string Demo::RowLabel(const LayerSpec& spec, const Rows& rows,
                           int32_t r) const {
  return absl::StrCat("step ", steps_, " layer ", spec.layer, " row ", r,
                      " (seq ", rows.seq[r], ", pos ", rows.pos[r],
                      ", visible ",
                      VisibleEntries(rows.pos[r], spec.compress_ratio), ")");
}

absl::Status Demo::CheckTokenLayer(const LayerSpec& spec, const Queries& q,
                                   const Rows& rows,
                                   const std::vector<int32_t>& sample,
                                   const std::vector<int32_t>& topk,
                                   AgreementReport& report) {
  const std::vector<PoolBounds>* source_pools = nullptr;
  if (spec.is_consumer()) {
    auto it = pools_.find(spec.candidate_source);
    if (it == pools_.end()) {
      return absl::InternalError(absl::StrCat(
          "demo: consumer layer ", spec.layer, " ran before its source ",
          spec.candidate_source));
    }
    source_pools = &it->second;
  }
  std::vector<PoolBounds> pools(spec.is_source() ? sample.size() : 0);
  std::vector<RowVerdict> verdicts(sample.size());
  std::vector<absl::Status> errors(sample.size());
  ParallelFor(static_cast<int64_t>(sample.size()), [&](int64_t i) {
    const int32_t r = sample[i];
    const int64_t visible = VisibleEntries(rows.pos[r], spec.compress_ratio);
    absl::StatusOr<std::vector<float>> logits =
        ref_.Logits(spec.layer, rows.seq[r], q.token, r, visible);
    if (!logits.ok()) {
      errors[i] = logits.status();
      return;
    }
    const absl::Span<const int32_t> got = absl::MakeConstSpan(topk).subspan(
        static_cast<size_t>(r) * spec.topk, spec.topk);
    if (spec.is_consumer()) {
      verdicts[i] = CheckConsumerRow(*logits, (*source_pools)[i],
                                     spec.candidate_block_size, got);
      return;
    }
    // A source's own output is the dense top-k.
    verdicts[i] = CheckTopkRow(*logits, got);
    if (spec.is_source()) {
      pools[i] = BoundCandidatePool(
          BlockMaxima(*logits, spec.candidate_block_size),
          spec.candidate_topk_blocks, spec.pin_newest_block,
          TopkSlack(*logits));
    }
  });
  for (size_t i = 0; i < sample.size(); ++i) {
    RETURN_IF_ERROR(errors[i]);
    report.Add(RowLabel(spec, rows, sample[i]), verdicts[i]);
  }
  if (spec.is_source()) {
    for (const PoolBounds& b : pools) {
      ambiguous_pools_ += b.ambiguous();
      maybe_blocks_ += static_cast<int64_t>(b.maybe.size());
    }
    source_rows_ += static_cast<int64_t>(pools.size());
    pools_[spec.layer] = std::move(pools);
  }
  return absl::OkStatus();
}

absl::Status Demo::CheckBlockLayer(const LayerSpec& spec, const Queries& q,
                                   const Rows& rows,
                                   const std::vector<int32_t>& sample,
                                   const std::vector<int32_t>& topk,
                                   AgreementReport& report) {
  const int32_t heads = spec.num_heads;
  const int64_t n = static_cast<int64_t>(sample.size()) * heads;
  std::vector<RowVerdict> verdicts(n);
  std::vector<absl::Status> errors(n);
  ParallelFor(n, [&](int64_t i) {
    const int32_t r = sample[i / heads];
    const int32_t h = static_cast<int32_t>(i % heads);
    const int64_t visible = VisibleEntries(rows.pos[r], spec.compress_ratio);
    absl::StatusOr<std::vector<float>> scores =
        ref_.BlockScores(spec.layer, rows.seq[r], q.block, r, h, visible);
    if (!scores.ok()) {
      errors[i] = scores.status();
      return;
    }
    const size_t at =
        (static_cast<size_t>(h) * rows.count() + r) * spec.topk_blocks;
    verdicts[i] = CheckBlockRow(
        *scores, absl::MakeConstSpan(topk).subspan(at, spec.topk_blocks));
  });
  for (int64_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(errors[i]);
    report.Add(absl::StrCat(RowLabel(spec, rows, sample[i / heads]), " head ",
                            i % heads),
               verdicts[i]);
  }
  return absl::OkStatus();
}

// Prints the last row of the first --rows-to-print sequences (head 0 of a
// block layer): its returned indices in order of reference score, the best
// few.
void Demo::PrintRows(const LayerSpec& spec, const Queries& q,
                     const Rows& rows, int32_t q_len,
                     const std::vector<int32_t>& topk) {
  constexpr int kShown = 8;
  const int32_t n = std::min<int32_t>(flags_.rows_to_print,
                                      static_cast<int32_t>(ids_.size()));
  for (int32_t s = 0; s < n; ++s) {
    const int32_t r = (s + 1) * q_len - 1;
    const int64_t visible = VisibleEntries(rows.pos[r], spec.compress_ratio);
    absl::StatusOr<std::vector<float>> scores =
        spec.is_block() ? ref_.BlockScores(spec.layer, s, q.block, r, 0,
                                           visible)
                        : ref_.Logits(spec.layer, s, q.token, r, visible);
    if (!scores.ok()) continue;
    // Row r of [rows, topk], or of head 0 of [Hi, rows, topk_blocks].
    const int64_t limit = static_cast<int64_t>(scores->size());
    std::vector<int32_t> got;
    for (int32_t i = 0; i < spec.topk; ++i) {
      const int32_t idx = topk[static_cast<size_t>(r) * spec.topk + i];
      if (idx >= 0 && idx < limit) got.push_back(idx);
    }
    std::sort(got.begin(), got.end(), [&](int32_t a, int32_t b) {
      return (*scores)[a] > (*scores)[b];
    });
    std::string shown;
    for (size_t i = 0; i < got.size() && i < kShown; ++i) {
      absl::StrAppend(&shown, " ", got[i], "(",
                      absl::SixDigits((*scores)[got[i]]), ")");
    }
    std::printf("    layer %u row %d (seq %d, pos %" PRId64 ", visible %" PRId64
                "): %zu %s, best:%s%s\n",
                spec.layer, r, s, rows.pos[r], visible, got.size(),
                spec.is_block() ? "blocks of head 0" : "indices",
                shown.c_str(), got.size() > kShown ? " ..." : "");
  }
}

// Prompt tokens per sequence per prefill step so that the largest layer
// request and its reply stay within `budget` bytes.
int32_t PrefillChunk(const std::vector<LayerSpec>& specs,
                     const DemoFlags& flags, int32_t prompt,
                     BlockQFormat block_q, int64_t budget) {
  int64_t per_token = 1;
  for (const LayerSpec& spec : specs) {
    per_token = std::max<int64_t>(
        per_token, LayerRequestBytes(spec, 1, 1, flags.q_fp32,
                                     flags.prequantized, block_q) +
                       ReplyBytesPerRow(spec));
  }
  int64_t chunk = budget / (per_token * flags.seqs);
  if (flags.prefill_chunk > 0) chunk = std::min<int64_t>(chunk, flags.prefill_chunk);
  return static_cast<int32_t>(std::clamp<int64_t>(chunk, 1, prompt));
}

// Tokens a sequence needs before a row sees more than `entries` entries.
int64_t TokensBeyond(int64_t entries, int32_t compress_ratio) {
  return (entries + 1) * compress_ratio;
}

// Tokens beyond which a layer's choice is a real one: a candidate source's
// rows have more blocks than the pool, a block layer's rows more causal
// blocks than topk_blocks. 0 for dense layers.
int64_t ChoosingTokens(const LayerSpec& spec) {
  if (spec.is_source()) {
    return TokensBeyond(int64_t{spec.candidate_topk_blocks} *
                            spec.candidate_block_size,
                        spec.compress_ratio);
  }
  if (spec.is_block()) {
    return TokensBeyond(int64_t{spec.topk_blocks} * spec.page_entries,
                        spec.compress_ratio);
  }
  return 0;
}

constexpr int32_t kDefaultPrompt = 1000;
// The auto prompt stays small enough for a cpu daemon.
constexpr int64_t kMaxAutoPrompt = 4096;

// A short prefill after an imported context: every row sees about the
// whole context, and prefill rows stay cheap.
constexpr int32_t kPromptAfterContext = 16;

// --prompt 0: 1000 tokens, or more where that makes every candidate pool and
// block choice a real one (1.5 x the tokens that fill them) within
// kMaxAutoPrompt; kPromptAfterContext after an imported --context.
int32_t DemoPrompt(const std::vector<LayerSpec>& specs, int32_t context) {
  if (context > 0) return kPromptAfterContext;
  int64_t want = kDefaultPrompt;
  for (const LayerSpec& spec : specs) {
    const int64_t fill = ChoosingTokens(spec);
    if (fill > 0 && fill * 3 / 2 <= kMaxAutoPrompt) {
      want = std::max(want, fill * 3 / 2);
    }
  }
  return static_cast<int32_t>(want);
}

// One line per candidate set and block group: whether the run's rows have
// more blocks than the layer chooses, or every block is taken.
void PrintChoiceNotes(const std::vector<LayerSpec>& specs,
                      int64_t final_tokens) {
  std::set<std::string> printed;
  for (const LayerSpec& spec : specs) {
    const int64_t fill = ChoosingTokens(spec);
    if (fill == 0) continue;
    const int64_t entries = EntriesFor(final_tokens, spec.compress_ratio);
    std::string line;
    if (spec.is_source()) {
      int32_t consumers = 0;
      for (const LayerSpec& c : specs) {
        consumers += c.is_consumer() && c.candidate_source == spec.layer;
      }
      const int64_t pool_entries =
          int64_t{spec.candidate_topk_blocks} * spec.candidate_block_size;
      const int64_t blocks = CausalBlocks(entries, spec.candidate_block_size);
      line = absl::StrCat(
          "pool note: candidate set of layer ", spec.layer, " (", consumers,
          " consumers): pool ", spec.candidate_topk_blocks, " blocks x ",
          spec.candidate_block_size, " entries = ", pool_entries,
          " entries = ", pool_entries * spec.compress_ratio, " tokens at r=",
          spec.compress_ratio, "; the longest row sees ", entries,
          " entries (", blocks, " blocks): ",
          blocks > spec.candidate_topk_blocks
              ? absl::StrCat("rows from position ", fill - 1, " on choose ",
                             spec.candidate_topk_blocks, " of their blocks")
              : absl::StrCat("every block is in every pool, so consumers "
                             "equal the dense path; --context (or --prompt) ",
                             fill, " or more makes the pool choose"));
    } else {
      const int64_t blocks = CausalBlocks(entries, spec.page_entries);
      line = absl::StrCat(
          "block note: group ", spec.group, ": top ", spec.topk_blocks,
          " blocks of ", spec.page_entries, " entries; the longest row has ",
          blocks, " causal blocks: ",
          blocks > spec.topk_blocks
              ? absl::StrCat("rows from position ", fill - 1, " on choose ",
                             spec.topk_blocks, " of their blocks")
              : absl::StrCat("every causal block is chosen; --context (or "
                             "--prompt) ", fill, " or more makes the choice "
                             "real"));
    }
    if (printed.insert(line).second) std::printf("%s\n", line.c_str());
  }
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
  ASSIGN_OR_RETURN(BlockQFormat block_q, ParseBlockQFormat(demo.block_q));
  const int32_t next_n = std::max<uint32_t>(1, info.next_n());
  const int32_t prompt =
      demo.prompt > 0 ? demo.prompt : DemoPrompt(specs, demo.context);
  const int32_t chunk =
      PrefillChunk(specs, demo, prompt, block_q, RequestBudget(info, flags));
  std::printf("demo: profile %s on %s; %zu layers; %d sequences, context %d "
              "imported + prompt %d (%d tokens per prefill step), %d decode "
              "steps of q_len %d; Q %s (block layers %s), K %s\n",
              info.profile().c_str(), info.device().c_str(), specs.size(),
              demo.seqs, demo.context, prompt, chunk, demo.decode_steps,
              next_n,
              demo.q_fp32 ? "FP32" : "quantized", BlockQFormatName(block_q),
              demo.prequantized ? "pre-quantized UINT8" : "FP32");
  for (const LayerSpec& spec : specs) {
    std::printf("  layer %3u group %-12s %s; %s\n", spec.layer,
                spec.group.c_str(), spec.DebugString().c_str(),
                spec.RoleString().c_str());
  }
  PrintChoiceNotes(specs, int64_t{demo.context} + prompt +
                             int64_t{demo.decode_steps} * next_n);

  OwnedSequences owned(client.get());
  Demo run(client.get(), specs, demo, block_q, &owned);
  if (demo.context > 0) {
    RETURN_IF_ERROR(run.Import(demo.context, RequestBudget(info, flags)));
  }
  for (int32_t done = 0; done < prompt; done += chunk) {
    RETURN_IF_ERROR(run.RunStep(std::min(chunk, prompt - done),
                                done == 0 && demo.context == 0, "prefill"));
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
  if (run.source_rows() > 0) {
    std::printf("candidate pools: %" PRId64 " of %" PRId64 " checked source "
                "rows had blocks within tolerance of the pool cut (%" PRId64
                " such blocks); their consumers were checked against both "
                "bounds of the pool\n",
                run.ambiguous_pools(), run.source_rows(), run.maybe_blocks());
  }
  std::printf("agreement: %" PRId64 "/%" PRId64
              " rows across %zu layers and %d steps: %s\n",
              report.agreeing(), report.rows(), specs.size(), run.steps(),
              report.full() ? "FULL" : "MISMATCH");
  return report.full();
}

}  // namespace indexer::client::cli
