// `indexer-cli bench`: per-layer latency of decode steps over sequences of a
// given context. See kBenchHelp in cli.cc for what is timed and committed.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <unistd.h>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/cli_common.h"
#include "client/cli_transport.h"
#include "client/reference.h"
#include "client/workload.h"
#include "indexer/ring_channel.h"
#include "kernels/common/status_macros.h"

namespace indexer::client::cli {
namespace {

using Clock = std::chrono::steady_clock;

// "all", "3", "0,4,8", "0-7", or a mix; every id must be a profile layer.
absl::StatusOr<std::set<uint32_t>> ParseLayers(
    const std::string& text, const std::vector<LayerSpec>& specs) {
  std::set<uint32_t> known, chosen;
  for (const LayerSpec& s : specs) known.insert(s.layer);
  if (text == "all") return known;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> ends = absl::StrSplit(part, '-');
    uint32_t lo = 0, hi = 0;
    if (ends.size() > 2 || !absl::SimpleAtoi(ends[0], &lo) ||
        !absl::SimpleAtoi(ends.back(), &hi) || hi < lo) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--layers: expected all, N, N,M or N-M, got '", text, "'"));
    }
    for (uint32_t l = lo; l <= hi; ++l) {
      if (!known.count(l)) {
        return absl::NotFoundError(
            absl::StrCat("--layers: the profile has no layer ", l));
      }
      chosen.insert(l);
    }
  }
  if (chosen.empty()) {
    return absl::InvalidArgumentError("--layers: no layer chosen");
  }
  return chosen;
}

// Random K entries of one geometry, raw and quantized, handed out cyclically.
struct EntryPool {
  static constexpr int64_t kEntries = 4096;
  std::vector<float> raw;       // [kEntries, D]
  std::vector<uint8_t> linear;  // [kEntries, VB + SB]
  int64_t next = 0;

  // The next `n` entries as a K tensor (wrapping around).
  v1::Tensor Take(const LayerSpec& spec, int64_t n, bool prequantized) {
    const int64_t d = spec.head_dim, eb = spec.entry_bytes();
    std::vector<float> r;
    std::vector<uint8_t> q;
    for (int64_t i = 0; i < n; ++i, next = (next + 1) % kEntries) {
      if (prequantized) {
        q.insert(q.end(), linear.begin() + next * eb,
                 linear.begin() + (next + 1) * eb);
      } else {
        r.insert(r.end(), raw.begin() + next * d, raw.begin() + (next + 1) * d);
      }
    }
    return MakeKTensor(spec, r, q, prequantized);
  }
};

using PoolKey = std::tuple<int, int32_t, bool>;  // format, D, ue8m0
PoolKey KeyOf(const LayerSpec& s) {
  return {static_cast<int>(s.format), s.head_dim, s.ue8m0};
}

const char* RoleTag(const LayerSpec& spec) {
  if (spec.is_source()) return "source";
  if (spec.is_consumer()) return "consumer";
  if (spec.is_block()) return "block";
  return "dense";
}

struct LayerStats {
  std::vector<double> rtt_us, server_us, logits_us, topk_us;
  std::vector<double> queue_us, validate_us, write_us;
  // The daemon's host side of the backend call (gpu), and, when the daemon
  // runs on this host (its clock stamps are comparable), the request's way
  // in (client encode, gRPC, socket, the daemon's read) and the reply's way
  // out (the daemon's send, socket, gRPC, client parse).
  std::vector<double> enqueue_us, wait_us, way_in_us, way_out_us;
  // Same host: how long the request waited for the daemon to finish the
  // message before it (the step header, for a step's first layer).
  std::vector<double> behind_us;
  // Same host, a step's first layer: the stream's way in (OpenStep to the
  // daemon's reactor), the header's arrival after it, and its handling.
  std::vector<double> stream_in_us, header_after_us, begin_us;
};

class Bench {
 public:
  Bench(IndexerClient* client, const v1::ServerInfo& info,
        std::vector<LayerSpec> specs, std::set<uint32_t> timed,
        const GlobalFlags& global, const BenchFlags& flags,
        BlockQFormat block_q, OwnedSequences* owned, BenchTransport* transport,
        RingChannel* ring);

  absl::Status Populate();
  absl::Status RunSteps();
  void Report() const;
  double StepMinusOwnP50() const;

 private:
  absl::Status ImportWithWriteEntries(int32_t s);
  absl::Status ImportWithSteps();
  // One step of `q_len` tokens per sequence; `measure` records the timed
  // layers; `dummy_q` (zero queries, nothing timed) fills the cache.
  absl::Status Step(int32_t q_len, bool create, bool measure, bool dummy_q);
  v1::LayerRequest QueryTemplate(const LayerSpec& spec, int32_t rows,
                                 bool dummy);

  IndexerClient* client_;
  const v1::ServerInfo& info_;
  std::vector<LayerSpec> specs_;
  std::set<uint32_t> timed_;
  // Layers each step runs with --abort-steps: the timed ones and the
  // candidate sources of timed consumers.
  std::set<uint32_t> run_;
  GlobalFlags global_;
  BenchFlags flags_;
  BlockQFormat block_q_;
  OwnedSequences* owned_;
  BenchTransport* transport_;
  RingChannel* ring_;  // --transport ring: the step's messages go through it
  Rng rng_;
  std::map<PoolKey, EntryPool> pools_;
  std::map<uint32_t, v1::LayerRequest> decode_q_;  // per layer, K unset
  std::vector<v1::SequenceId> ids_;
  std::vector<int64_t> tokens_;
  std::map<uint32_t, LayerStats> stats_;
  std::vector<double> step_us_;
  // Per measured step: the bench's own work between a step's layers
  // (building each request and, for region transports, writing its tensors
  // into the region), which a front-end producing Q on the GPU does not pay.
  std::vector<double> step_own_us_;
  double measured_wall_us_ = 0;
};

Bench::Bench(IndexerClient* client, const v1::ServerInfo& info,
             std::vector<LayerSpec> specs, std::set<uint32_t> timed,
             const GlobalFlags& global, const BenchFlags& flags,
             BlockQFormat block_q, OwnedSequences* owned, BenchTransport* transport,
             RingChannel* ring)
    : client_(client),
      info_(info),
      specs_(std::move(specs)),
      timed_(std::move(timed)),
      global_(global),
      flags_(flags),
      block_q_(block_q),
      owned_(owned),
      transport_(transport),
      ring_(ring),
      rng_(flags.seed) {
  for (const LayerSpec& spec : specs_) {
    if (!timed_.count(spec.layer)) continue;
    run_.insert(spec.layer);
    if (spec.is_consumer()) run_.insert(spec.candidate_source);
  }
  const std::string tag = RunTag();
  for (int32_t s = 0; s < flags.batch; ++s) {
    ids_.push_back(
        NamedSequenceId(absl::StrCat("indexer-cli-bench-", tag, "-", s)));
    tokens_.push_back(0);
  }
  for (const LayerSpec& spec : specs_) {
    EntryPool& pool = pools_[KeyOf(spec)];
    if (!pool.raw.empty()) continue;
    pool.raw.resize(EntryPool::kEntries * spec.head_dim);
    rng_.FillNormal(absl::MakeSpan(pool.raw));
    pool.linear = QuantizeKEntries(spec, pool.raw);
  }
  for (const LayerSpec& spec : specs_) {
    decode_q_[spec.layer] =
        QueryTemplate(spec, flags.batch * flags.q_len, false);
  }
}

v1::LayerRequest Bench::QueryTemplate(const LayerSpec& spec, int32_t rows,
                                      bool dummy) {
  // Dummy queries (zeros) serve only to fill the cache by prefill steps.
  std::vector<float> raw_q(static_cast<size_t>(rows) * spec.num_heads *
                           spec.head_dim);
  if (!dummy) rng_.FillNormal(absl::MakeSpan(raw_q));
  v1::LayerRequest request;
  request.set_layer(spec.layer);
  if (spec.is_block()) {
    // [rows, Hi, D], no weights; the values scored are not needed here.
    SetBlockQueries(spec, rows, raw_q, block_q_, &request);
    return request;
  }
  const std::vector<float> raw_w = RandomWeights(rng_, spec, rows);
  const QuantizedQ q = QuantizeQ(spec, rows, raw_q, raw_w);
  SetQueries(spec, q, raw_q, raw_w, flags_.q_fp32 && !dummy, &request);
  return request;
}

absl::Status Bench::ImportWithWriteEntries(int32_t s) {
  // An import carries at most max_q_len tokens (older daemons do not say:
  // their default, 65536).
  const int64_t max_q_len = info_.max_q_len() > 0 ? info_.max_q_len() : 65536;
  const int64_t chunk = ImportChunkTokens(
      specs_, max_q_len, std::min<int64_t>(RequestBudget(info_, global_), 32 << 20));
  ProgressLine progress;
  while (tokens_[s] < flags_.context) {
    const int64_t n = std::min<int64_t>(chunk, flags_.context - tokens_[s]);
    v1::WriteEntriesRequest request;
    *request.mutable_id() = ids_[s];
    request.set_create(tokens_[s] == 0);
    request.set_num_tokens(n);
    for (const LayerSpec& spec : specs_) {
      v1::LayerEntries* layer = request.add_layers();
      layer->set_layer(spec.layer);
      *layer->mutable_k() = pools_[KeyOf(spec)].Take(
          spec, NewEntriesFor(tokens_[s], n, spec.compress_ratio), true);
    }
    absl::StatusOr<uint64_t> len = client_->WriteEntries(request);
    if (!len.ok()) {
      return absl::Status(len.status().code(),
                          absl::StrCat("import of sequence ", s, ": ",
                                       len.status().message()));
    }
    if (request.create()) owned_->Add(ids_[s]);
    tokens_[s] += n;
    if (*len != static_cast<uint64_t>(tokens_[s])) {
      return absl::InternalError(absl::StrCat(
          "WriteEntries seq_len: expected ", tokens_[s], ", got ", *len));
    }
    progress.Update(absl::StrCat("  import: sequence ", s + 1, "/",
                                 flags_.batch, ", ", tokens_[s], "/",
                                 flags_.context, " tokens"));
  }
  progress.Done();
  return absl::OkStatus();
}

absl::Status Bench::ImportWithSteps() {
  // Prefill steps with zero queries; chunked to fit the message budget.
  int64_t per_row = 1;
  for (const LayerSpec& spec : specs_) {
    per_row = std::max<int64_t>(
        per_row, LayerRequestBytes(spec, 1, 1, false, flags_.prequantized,
                                   block_q_) +
                     ReplyBytesPerRow(spec));
  }
  const int64_t max_q_len = info_.max_q_len() > 0 ? info_.max_q_len() : 65536;
  const int64_t chunk = std::clamp<int64_t>(
      RequestBudget(info_, global_) / (per_row * flags_.batch), 1,
      std::min<int64_t>(flags_.context, max_q_len));
  ProgressLine progress;
  while (tokens_[0] < flags_.context) {
    const int32_t q_len = static_cast<int32_t>(
        std::min<int64_t>(chunk, flags_.context - tokens_[0]));
    RETURN_IF_ERROR(Step(q_len, tokens_[0] == 0, false, true));
    progress.Update(absl::StrCat("  prefill: ", tokens_[0], "/",
                                 flags_.context, " tokens"));
  }
  progress.Done();
  return absl::OkStatus();
}

absl::Status Bench::Populate() {
  const auto start = Clock::now();
  for (int32_t s = 0; s < flags_.batch; ++s) {
    absl::Status status = ImportWithWriteEntries(s);
    if (status.ok()) continue;
    // A daemon without import fails the very first write as UNIMPLEMENTED.
    if (status.code() != absl::StatusCode::kUnimplemented || s != 0 ||
        tokens_[0] != 0) {
      return status;
    }
    std::printf("WriteEntries unimplemented; filling by prefill steps\n");
    RETURN_IF_ERROR(ImportWithSteps());
    break;
  }
  std::printf("populated %d sequences x %d tokens in %.2f s\n", flags_.batch,
              flags_.context, MicrosSince(start) * 1e-6);
  return absl::OkStatus();
}

absl::Status Bench::Step(int32_t q_len, bool create, bool measure,
                         bool dummy_q) {
  v1::StepHeader header;
  header.set_request_id("indexer-cli-bench");
  for (const v1::SequenceId& id : ids_) {
    v1::StepSequence* seq = header.add_sequences();
    *seq->mutable_id() = id;
    seq->set_q_len(q_len);
    seq->set_create(create);
  }
  const bool abort = flags_.abort_steps && !dummy_q;
  const auto step_start = Clock::now();
  double own_us = 0;
  std::unique_ptr<StepSession> session;
  if (ring_ != nullptr) {
    RETURN_IF_ERROR(ring_->Begin(header));
  } else {
    ASSIGN_OR_RETURN(session, client_->OpenStep(header));
  }
  for (const LayerSpec& spec : specs_) {
    const bool timed = timed_.count(spec.layer) > 0 && !dummy_q;
    if (abort && !run_.count(spec.layer)) continue;
    const auto own_start = Clock::now();
    v1::LayerRequest request =
        dummy_q ? QueryTemplate(spec, flags_.batch * q_len, true)
                : decode_q_[spec.layer];
    int64_t n_new = 0;
    for (int64_t t : tokens_) n_new += NewEntriesFor(t, q_len, spec.compress_ratio);
    *request.mutable_k() =
        pools_[KeyOf(spec)].Take(spec, n_new, flags_.prequantized);
    // Region transports write the tensors into the region here, as a
    // front-end producing them there would, before the clock starts (the
    // inline path's request is also built before it).
    const int64_t topk_bytes =
        ReplyBytesPerRow(spec) * int64_t{flags_.batch} * q_len;
    RETURN_IF_ERROR(transport_->Prepare(&request, topk_bytes));
    const auto start = Clock::now();
    own_us += std::chrono::duration<double, std::micro>(start - own_start).count();
    absl::StatusOr<v1::LayerReply> reply =
        ring_ != nullptr ? ring_->RunLayer(request) : session->RunLayer(std::move(request));
    const auto end = Clock::now();
    const double rtt = std::chrono::duration<double, std::micro>(end - start).count();
    if (!reply.ok()) {
      return absl::Status(reply.status().code(),
                          absl::StrCat("layer ", spec.layer, ": ",
                                       reply.status().message()));
    }
    RETURN_IF_ERROR(transport_->CheckReply(*reply, topk_bytes));
    if (measure && timed) {
      LayerStats& st = stats_[spec.layer];
      st.rtt_us.push_back(rtt);
      st.server_us.push_back(reply->timings().total_us());
      st.logits_us.push_back(reply->timings().logits_us());
      st.topk_us.push_back(reply->timings().topk_us());
      st.queue_us.push_back(reply->timings().queue_us());
      st.validate_us.push_back(reply->timings().validate_us());
      st.write_us.push_back(reply->timings().write_us());
      st.enqueue_us.push_back(reply->timings().enqueue_us());
      st.wait_us.push_back(reply->timings().wait_us());
      const int64_t in_ns = reply->timings().received_clock_ns() -
                            std::chrono::duration_cast<std::chrono::nanoseconds>(
                                start.time_since_epoch()).count();
      const int64_t out_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 end.time_since_epoch()).count() -
                             reply->timings().replied_clock_ns();
      // Another host's clock gives values outside [0, rtt]: not recorded.
      if (in_ns >= 0 && out_ns >= 0 && (in_ns + out_ns) / 1e3 <= rtt) {
        // The way in counts from when the daemon began reading.
        const int64_t behind_ns = std::max<int64_t>(
            0, reply->timings().read_clock_ns() - (reply->timings().received_clock_ns() - in_ns));
        st.behind_us.push_back(behind_ns / 1e3);
        st.way_in_us.push_back((in_ns - behind_ns) / 1e3);
        st.way_out_us.push_back(out_ns / 1e3);
        const v1::LayerTimings& t = reply->timings();
        if (t.stream_clock_ns() != 0) {
          st.stream_in_us.push_back(
              (t.stream_clock_ns() -
               std::chrono::duration_cast<std::chrono::nanoseconds>(step_start.time_since_epoch())
                   .count()) / 1e3);
          st.header_after_us.push_back((t.header_clock_ns() - t.stream_clock_ns()) / 1e3);
          st.begin_us.push_back(t.begin_us());
        }
      }
    }
  }
  if (abort) {
    if (ring_ != nullptr) {
      RETURN_IF_ERROR(ring_->Abort());
    } else {
      session->Abort();
    }
  } else {
    ASSIGN_OR_RETURN(v1::StepCommitted committed,
                     ring_ != nullptr ? ring_->Commit() : session->Commit());
    (void)committed;
    for (size_t s = 0; s < ids_.size(); ++s) {
      if (create) owned_->Add(ids_[s]);
      tokens_[s] += q_len;
    }
  }
  if (measure) {
    step_us_.push_back(MicrosSince(step_start));
    step_own_us_.push_back(own_us);
  }
  return absl::OkStatus();
}

absl::Status Bench::RunSteps() {
  const int32_t total = flags_.warmup + flags_.steps;
  ProgressLine progress;
  Clock::time_point measured_start = Clock::now();
  for (int32_t i = 0; i < total; ++i) {
    if (i == flags_.warmup) measured_start = Clock::now();
    const bool measure = i >= flags_.warmup;
    absl::Status status = Step(flags_.q_len, false, measure, false);
    if (!status.ok()) {
      progress.Done();
      return absl::Status(status.code(), absl::StrCat("step ", i, ": ",
                                                      status.message()));
    }
    progress.Update(absl::StrCat("  step ", i + 1, "/", total,
                                 measure ? "" : " (warmup)", ", context ",
                                 tokens_[0]));
  }
  measured_wall_us_ = MicrosSince(measured_start);
  progress.Done();
  return absl::OkStatus();
}

void Bench::Report() const {
  std::printf("%-6s %-9s %-6s %5s %5s %10s %10s %10s %10s %10s\n", "layer",
              "role", "format", "H", "topk", "rtt p50", "rtt p99",
              "server p50", "logits p50", "topk p50");
  std::vector<double> all_rtt;
  double rtt_sum = 0;
  for (const LayerSpec& spec : specs_) {
    auto it = stats_.find(spec.layer);
    if (it == stats_.end()) continue;
    const LayerStats& st = it->second;
    std::printf("%-6u %-9s %-6s %5d %5d %10.1f %10.1f %10.1f %10.1f %10.1f\n",
                spec.layer, RoleTag(spec), KvFormatName(spec.format),
                spec.num_heads,
                spec.topk, Percentile(st.rtt_us, 50), Percentile(st.rtt_us, 99),
                Percentile(st.server_us, 50), Percentile(st.logits_us, 50),
                Percentile(st.topk_us, 50));
    all_rtt.insert(all_rtt.end(), st.rtt_us.begin(), st.rtt_us.end());
    for (double x : st.rtt_us) rtt_sum += x;
  }
  // A gpu daemon times a layer's logits and its top-k kernels as one span
  // by default (indexer.proto, LayerTimings.logits_us): say so where every
  // layer's top-k came back 0.
  bool joint = !stats_.empty();
  for (const auto& [layer, st] : stats_) {
    joint = joint && Percentile(st.topk_us, 50) == 0.0 && Percentile(st.logits_us, 50) > 0.0;
  }
  if (joint) {
    std::printf("(logits includes the top-k: the daemon timed them as one span; "
                "INDEXER_GPU_SPLIT_TIMING=1 on a gpu daemon times them apart)\n");
  }
  // Where the server's time goes: `queue` runs from the receipt of the
  // whole message to the start of work (the daemon parses the request in
  // it); the rest of `server` is the backend call around its kernels
  // (uploads, downloads, synchronization).
  for (const auto& [layer, st] : stats_) {
    std::printf("layer %u server p50 (us): queue+parse %.1f, validate %.1f, write "
                "%.1f, logits %.1f, topk %.1f, total %.1f\n",
                layer, Percentile(st.queue_us, 50),
                Percentile(st.validate_us, 50), Percentile(st.write_us, 50),
                Percentile(st.logits_us, 50), Percentile(st.topk_us, 50),
                Percentile(st.server_us, 50));
  }
  for (const auto& [layer, st] : stats_) {
    std::printf("layer %u backend host p50 (us): enqueue %.1f, wait %.1f", layer,
                Percentile(st.enqueue_us, 50), Percentile(st.wait_us, 50));
    if (!st.way_in_us.empty()) {
      std::printf("; same-host split p50 (us): behind the previous message %.1f, way in %.1f, "
                  "way out %.1f (%zu of %zu layers)",
                  Percentile(st.behind_us, 50), Percentile(st.way_in_us, 50),
                  Percentile(st.way_out_us, 50),
                  st.way_in_us.size(), st.rtt_us.size());
    }
    std::printf("\n");
    if (!st.stream_in_us.empty()) {
      std::printf("layer %u step start p50 (us, its first layer): stream open -> daemon %.1f, "
                  "header %.1f after, header handled in %.1f (%zu steps)\n",
                  layer, Percentile(st.stream_in_us, 50), Percentile(st.header_after_us, 50),
                  Percentile(st.begin_us, 50), st.stream_in_us.size());
    }
  }
  // What the service adds to the kernels (SPEC §8's service target), per
  // layer call: rtt - (logits + topk); and its transport part, rtt - the
  // server's total: the client's request encoding and reply parse, gRPC and
  // the socket both ways, the daemon's reply send (grpc_echo_bench measures
  // the same bytes without protobuf).
  for (const auto& [layer, st] : stats_) {
    std::vector<double> over_kernels, over_server;
    for (size_t i = 0; i < st.rtt_us.size(); ++i) {
      over_kernels.push_back(st.rtt_us[i] - st.logits_us[i] - st.topk_us[i]);
      over_server.push_back(st.rtt_us[i] - st.server_us[i]);
    }
    std::printf("layer %u adds to its kernels p50 %.1f us (rtt - logits - "
                "topk); outside the server p50 %.1f us (rtt - server total)\n",
                layer, Percentile(over_kernels, 50),
                Percentile(over_server, 50));
  }
  std::printf("(latencies in us; rtt = client round trip of one layer; "
              "server total = the daemon's receipt of the request to its "
              "reply; "
              "topk = entries per row, blocks per (head, row) for block "
              "layers)\n");
  const double steps = static_cast<double>(step_us_.size());
  std::printf("all timed layers: rtt p50 %.1f us, p99 %.1f us; %.0f layers/s "
              "(1 / mean rtt); step p50 %.1f us; %.1f steps/s wall\n",
              Percentile(all_rtt, 50), Percentile(all_rtt, 99),
              rtt_sum > 0 ? 1e6 * all_rtt.size() / rtt_sum : 0.0,
              Percentile(step_us_, 50),
              measured_wall_us_ > 0 ? 1e6 * steps / measured_wall_us_ : 0.0);
  std::printf("step p50 %.1f us of which the bench's own request building and region "
              "writes p50 %.1f us; the daemon and the transport: step - own p50 %.1f us\n",
              Percentile(step_us_, 50), Percentile(step_own_us_, 50), StepMinusOwnP50());
}

double Bench::StepMinusOwnP50() const {
  std::vector<double> d(step_us_.size());
  for (size_t i = 0; i < d.size(); ++i) d[i] = step_us_[i] - step_own_us_[i];
  return Percentile(d, 50);
}

}  // namespace

absl::Status RunBench(const GlobalFlags& global, const BenchFlags& flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<IndexerClient> client,
                   ConnectFromFlags(global));
  ASSIGN_OR_RETURN(v1::ServerInfo info, client->GetServerInfo());
  ASSIGN_OR_RETURN(std::vector<LayerSpec> specs, LayerSpecsFromInfo(info));
  if (specs.empty()) {
    return absl::FailedPreconditionError("server info lists no layers");
  }
  ASSIGN_OR_RETURN(std::set<uint32_t> timed, ParseLayers(flags.layers, specs));
  ASSIGN_OR_RETURN(BlockQFormat block_q, ParseBlockQFormat(flags.block_q));

  std::printf("bench: profile %s on %s\n", info.profile().c_str(),
              info.device().c_str());
  std::printf("shape: batch %d, context %d, q_len %d (next_n %u), %zu of %zu "
              "layers timed, %d warmup + %d steps, %s; Q %s, K %s\n",
              flags.batch, flags.context, flags.q_len, info.next_n(),
              timed.size(), specs.size(), flags.warmup, flags.steps,
              flags.abort_steps ? "steps aborted after the timed layers"
                                : "steps run all layers and commit",
              flags.q_fp32 ? "FP32" : "quantized",
              flags.prequantized ? "pre-quantized UINT8" : "FP32");
  std::printf("block layers: Q %s [rows, Hi, D], no weights\n",
              BlockQFormatName(block_q));
  std::set<std::string> shown;
  for (const LayerSpec& spec : specs) {
    if (!timed.count(spec.layer)) continue;
    const std::string line = absl::StrCat(spec.group, ": ", spec.DebugString());
    if (shown.insert(line).second) {
      std::printf("  group %s (visible entries %" PRId64 ")\n", line.c_str(),
                  EntriesFor(flags.context, spec.compress_ratio));
    }
  }
  // Role lines of the timed non-dense layers, with what a consumer's pool
  // covers at this context (the gather / masked walk choice is the
  // daemon's).
  for (const LayerSpec& spec : specs) {
    if (!timed.count(spec.layer) || spec.role == kRoleDense) continue;
    std::string extra;
    if (spec.is_consumer() || spec.is_source()) {
      const int64_t visible =
          EntriesFor(flags.context, spec.compress_ratio);
      const int64_t pool = std::min<int64_t>(
          visible,
          int64_t{spec.candidate_topk_blocks} * spec.candidate_block_size);
      extra = absl::StrCat(": pool ", pool, " of ", visible,
                           " visible entries");
    }
    std::printf("  layer %u %s%s\n", spec.layer, spec.RoleString().c_str(),
                extra.c_str());
  }

  const bool use_ring = flags.transport == "ring";
  ASSIGN_OR_RETURN(std::unique_ptr<BenchTransport> transport,
                   MakeBenchTransport(use_ring ? flags.ring_tensors : flags.transport, flags.host_region,
                                      client.get()));
  std::unique_ptr<RingChannel> ring;
  if (use_ring) {
    RingOptions ro;
    ro.spin = absl::Microseconds(flags.ring_spin_us);
    ro.shm_name = absl::StrCat("/indexer-cli-ring-", getpid());
    ASSIGN_OR_RETURN(ring, RingChannel::Open(client.get(), ro));
    std::printf("ring: %u slots of %u bytes, client spin %.0f us, daemon spin %u us, tensors in %s regions\n",
                ro.slot_count, ro.slot_bytes, flags.ring_spin_us, ring->server_spin_us(),
                flags.ring_tensors.c_str());
  }
  std::printf("transport: %s%s\n", use_ring ? "ring" : transport->name(),
              flags.transport == "inline"
                  ? " (tensors and top-k in the messages)"
                  : use_ring ? " (step messages through a request ring, tensors by reference "
                               "to a registered region, top-k via topk_out)"
                             : " (tensors by reference to a registered region, top-k via "
                               "topk_out)");
  OwnedSequences owned(client.get());
  Bench bench(client.get(), info, std::move(specs), std::move(timed), global,
              flags, block_q, &owned, transport.get(), ring.get());
  RETURN_IF_ERROR(bench.Populate());
  RETURN_IF_ERROR(bench.RunSteps());
  bench.Report();
  ASSIGN_OR_RETURN(uint64_t pages, owned.ReleaseAll());
  std::printf("released %d sequences (%" PRIu64 " pages)\n", flags.batch,
              pages);
  return absl::OkStatus();
}

}  // namespace indexer::client::cli
