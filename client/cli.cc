// indexer-cli: drives an indexerd daemon over the client library.
//   info     server geometry, layers, capacity
//   demo     prefill + decode steps on random data, checked against the
//            client-side reference (exit 1 unless every checked row agrees)
//   bench    per-layer latency of decode steps
//   release  drop sequences by id
//   health   grpc.health.v1 check (exit 0 only when SERVING): probes, HEALTHCHECK
//   list     this client's sequences
//   export   a sequence's entries to a file; import sends them to a daemon
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_common.h"
#include "client/reference.h"
#include "kernels/common/status_macros.h"

namespace indexer::client::cli {

// ----------------------------------------------------------------- common --

absl::StatusOr<std::unique_ptr<IndexerClient>> ConnectFromFlags(
    const GlobalFlags& flags) {
  ClientOptions options;
  options.max_message_bytes = flags.max_message_mb << 20;
  options.connect_timeout = absl::Seconds(flags.connect_timeout_s);
  if (!flags.tls_ca.empty() || !flags.tls_cert.empty() || !flags.tls_key.empty() ||
      !flags.tls_server_name.empty()) {
    options.tls = TlsOptions{flags.tls_ca, flags.tls_cert, flags.tls_key, flags.tls_server_name};
  }
  options.client_id = flags.client_id;
  options.client_id_header = flags.client_id_header;
  options.busy_poll = absl::Microseconds(flags.busy_poll_us);
  return IndexerClient::Connect(flags.addr, options);
}

OwnedSequences::~OwnedSequences() {
  absl::StatusOr<uint64_t> released = ReleaseAll();
  if (!released.ok()) {
    std::fprintf(stderr, "warning: releasing sequences failed: %s\n",
                 released.status().ToString().c_str());
  }
}

absl::StatusOr<uint64_t> OwnedSequences::ReleaseAll() {
  if (ids_.empty()) return 0;
  std::vector<v1::SequenceId> ids;
  ids.swap(ids_);
  // A step that was just aborted may still hold the sequences for a moment
  // on the daemon's side (FAILED_PRECONDITION): retry briefly.
  absl::StatusOr<uint64_t> released = client_->Release(ids);
  for (int delay_ms = 10; delay_ms <= 640 && !released.ok() &&
                          released.status().code() ==
                              absl::StatusCode::kFailedPrecondition;
       delay_ms *= 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    released = client_->Release(ids);
  }
  return released;
}

std::string RunTag() {
  std::random_device device;
  return absl::StrCat(absl::Hex(device() & 0xffffff, absl::kZeroPad6));
}

int64_t RequestBudget(const v1::ServerInfo& info, const GlobalFlags& flags) {
  int64_t limit = flags.max_message_mb << 20;
  if (info.max_message_bytes() > 0) {
    limit = std::min<int64_t>(limit, info.max_message_bytes());
  }
  return std::max<int64_t>(limit / 2, 1 << 20);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size());
  size_t i = rank <= 1 ? 0 : static_cast<size_t>(std::ceil(rank)) - 1;
  return values[std::min(i, values.size() - 1)];
}

double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now() - start)
      .count();
}

void ProgressLine::Update(const std::string& line, bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (last_ == std::chrono::steady_clock::time_point{}) {
    last_ = now;  // short runs print nothing: the first line waits a second
    if (!force) return;
  }
  if (!force && now - last_ < std::chrono::seconds(1)) return;
  std::fprintf(stderr, "\r%-78s", line.c_str());
  std::fflush(stderr);
  last_ = now;
  printed_ = true;
}

void ProgressLine::Done() {
  if (printed_) std::fprintf(stderr, "\n");
  printed_ = false;
  last_ = {};
}

// ------------------------------------------------------------------- info --

absl::Status RunInfo(const GlobalFlags& flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<IndexerClient> client,
                   ConnectFromFlags(flags));
  ASSIGN_OR_RETURN(v1::ServerInfo info, client->GetServerInfo());
  std::printf("indexerd %s at %s\n", info.version().c_str(),
              flags.addr.c_str());
  std::printf("  profile   %s\n", info.profile().c_str());
  std::printf("  device    %s\n", info.device().c_str());
  std::printf("  build     %s\n", info.build().c_str());
  std::printf("  features  %s\n",
              absl::StrJoin(info.features(), ", ").c_str());
  std::printf("  next_n %u, max message %" PRIu64 " MiB, logits budget %" PRIu64
              " MiB, open steps %u, sequences %" PRIu64 "\n",
              info.next_n(), info.max_message_bytes() >> 20,
              info.logits_budget_bytes() >> 20, info.open_steps(),
              info.sequences());
  std::printf("groups:\n");
  for (const v1::LayerGroupInfo& g : info.groups()) {
    std::printf("  %-16s %-5s%s D=%u E=%u r=%u %s entry=%uB pages %" PRIu64
                "/%" PRIu64 " free, layers [%s]\n",
                g.name().c_str(), g.kv_format().c_str(),
                g.kv_format() == "fp8" && g.ue8m0() ? " ue8m0" : "",
                g.head_dim(), g.page_entries(), g.compress_ratio(),
                g.layout().c_str(), g.entry_bytes(), g.free_pages(),
                g.total_pages(), absl::StrJoin(g.layers(), ",").c_str());
  }
  std::printf("layers:\n");
  absl::StatusOr<std::vector<LayerSpec>> specs = LayerSpecsFromInfo(info);
  if (!specs.ok()) {
    // Still show what the daemon said, raw, then why the client objects.
    for (const v1::LayerInfo& l : info.layers()) {
      std::printf("  layer %3u  group %-16s role %-18s heads %3u topk %u\n",
                  l.layer(), l.group().c_str(), l.role().c_str(),
                  l.num_heads(), l.topk());
    }
    return specs.status();
  }
  for (const LayerSpec& spec : *specs) {
    std::printf("  layer %3u  group %-16s heads %3d  %s\n", spec.layer,
                spec.group.c_str(), spec.num_heads,
                spec.RoleString().c_str());
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- release --

absl::Status RunRelease(const GlobalFlags& flags,
                        const std::vector<uint64_t>& nums,
                        const std::vector<std::string>& names) {
  if (nums.empty() && names.empty()) {
    return absl::InvalidArgumentError("release: give --id and/or --name");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<IndexerClient> client,
                   ConnectFromFlags(flags));
  std::vector<v1::SequenceId> ids;
  for (uint64_t n : nums) ids.push_back(NumericSequenceId(n));
  for (const std::string& s : names) ids.push_back(NamedSequenceId(s));
  ASSIGN_OR_RETURN(uint64_t pages, client->Release(ids));
  std::printf("released %zu sequence(s), %" PRIu64 " page(s)\n", ids.size(),
              pages);
  return absl::OkStatus();
}

}  // namespace indexer::client::cli

namespace {

constexpr char kBenchHelp[] =
    "Decode-step latency per layer. Creates --batch sequences of --context "
    "tokens (WriteEntries import in chunks; prefill steps when the daemon "
    "lacks import), runs --warmup + --steps decode steps of --q-len tokens "
    "per sequence and reports client round-trip p50/p99 per layer with the "
    "server's logits/top-k times.\n"
    "A step commits only with every layer of the profile, so by default each "
    "step runs all layers (only the --layers are timed) and commits: contexts "
    "grow by --q-len per step. With --abort-steps each step runs only the "
    "--layers (and the candidate sources of timed consumers, untimed) and "
    "is then aborted (rolled back): contexts stay at --context and untimed "
    "layers cost nothing.\n"
    "Block layers send Q in --block-q as [rows, Hi, D] without weights and "
    "get [Hi, rows, topk_blocks] block ids back.\n"
    "--transport host|device writes each layer's Q, weights and K into a "
    "registered region and sends references; the daemon writes the top-k "
    "into the region (topk_out); --host-region memfd passes the host region "
    "as a memfd instead of a shared-memory name. The figures are the same "
    "for every transport.";

}  // namespace

int main(int argc, char** argv) {
  using namespace indexer::client::cli;  // NOLINT: a main of this namespace
  indexer::client::TuneProcessAllocator();
  CLI::App app{"indexer-cli: drives an indexerd daemon (indexer.v1)"};
  app.require_subcommand(1);
  app.fallthrough();
  GlobalFlags global;
  app.add_option("--addr", global.addr, "daemon address host:port")
      ->capture_default_str();
  app.add_option("--max-message-mb", global.max_message_mb,
                 "largest gRPC message sent or received (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{2047}));
  app.add_option("--connect-timeout", global.connect_timeout_s,
                 "seconds to wait for the daemon")
      ->capture_default_str();
  app.add_option("--tls-ca", global.tls_ca,
                 "PEM CA bundle that verifies the daemon (any --tls-* flag = TLS)");
  app.add_option("--tls-cert", global.tls_cert, "client certificate (PEM) for mutual TLS");
  app.add_option("--tls-key", global.tls_key, "its private key (PEM)");
  app.add_option("--tls-server-name", global.tls_server_name,
                 "name expected in the daemon's certificate (default: the --addr host)");
  app.add_option("--client-id", global.client_id,
                 "client identity sent as metadata (namespaces sequences on plaintext)");
  app.add_option("--client-id-header", global.client_id_header,
                 "metadata key of --client-id")
      ->capture_default_str();
  app.add_option("--busy-poll-us", global.busy_poll_us,
                 "step streams poll for replies this long before blocking (0 = block)")
      ->check(CLI::Range(0.0, 1e6));

  CLI::App* info = app.add_subcommand("info", "print the server info");

  DemoFlags demo;
  CLI::App* demo_cmd = app.add_subcommand(
      "demo",
      "prefill + decode steps on random data through every layer, each "
      "layer's top-k checked against the client reference; exits 1 unless "
      "every checked row agrees");
  demo_cmd->add_option("--seqs", demo.seqs, "sequences")
      ->capture_default_str()->check(CLI::Range(1, 4096));
  demo_cmd->add_option("--context", demo.context,
                       "tokens per sequence imported by WriteEntries before "
                       "the prompt (random K the reference keeps; long "
                       "contexts without prefill cost)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 26));
  demo_cmd->add_option("--prompt", demo.prompt,
                       "prompt tokens per sequence (0 = 16 after --context, "
                       "else 1000, or up to 4096 where that makes candidate "
                       "pools and block choices real ones)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  demo_cmd->add_option("--decode-steps", demo.decode_steps,
                       "decode steps (q_len = the server's next_n)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  demo_cmd->add_flag("--q-fp32", demo.q_fp32,
                     "send Q as FP32 (the daemon quantizes it)");
  demo_cmd->add_flag("--prequantized", demo.prequantized,
                     "send K as UINT8 linear entries instead of FP32");
  demo_cmd->add_option("--block-q", demo.block_q,
                       "Q of block layers: fp32, bf16 or fp8 (e4m3 with a "
                       "per (row, head) q_scale)")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
  demo_cmd->add_option("--seed", demo.seed, "random seed")
      ->capture_default_str();
  demo_cmd->add_option("--rows-to-print", demo.rows_to_print,
                       "rows printed per step (first layer)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  demo_cmd->add_option("--check-rows", demo.check_rows,
                       "rows checked per layer per step, evenly spaced "
                       "(0 = all; prefill steps have many rows)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 30));
  demo_cmd->add_option("--prefill-chunk", demo.prefill_chunk,
                       "prompt tokens per sequence per prefill step (0 = "
                       "the whole prompt, split only to fit the message "
                       "limit)")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));

  BenchFlags bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", kBenchHelp);
  bench_cmd->add_option("--batch", bench.batch, "sequences per step")
      ->capture_default_str()->check(CLI::Range(1, 1 << 16));
  bench_cmd->add_option("--context", bench.context,
                        "tokens per sequence before the first step")
      ->capture_default_str()->check(CLI::Range(1, 1 << 26));
  bench_cmd->add_option("--steps", bench.steps, "measured steps")
      ->capture_default_str()->check(CLI::Range(1, 1 << 24));
  bench_cmd->add_option("--q-len", bench.q_len,
                        "new tokens per sequence per step")
      ->capture_default_str()->check(CLI::Range(1, 1 << 16));
  bench_cmd->add_option("--warmup", bench.warmup, "unmeasured first steps")
      ->capture_default_str()->check(CLI::Range(0, 1 << 20));
  bench_cmd->add_option("--layers", bench.layers,
                        "timed layers: all, or layer ids such as 3 or "
                        "0,4,8 or 0-7 (e.g. 19,21 times a dense layer and a "
                        "consumer at the same context)")
      ->capture_default_str();
  bench_cmd->add_flag("--abort-steps", bench.abort_steps,
                      "run only --layers and abort each step (see above)");
  bench_cmd->add_flag("--q-fp32", bench.q_fp32,
                      "send Q as FP32 (the daemon quantizes it)");
  bench_cmd->add_flag("--prequantized", bench.prequantized,
                      "send step K as UINT8 linear entries instead of FP32");
  bench_cmd->add_option("--block-q", bench.block_q,
                        "Q of block layers: fp32, bf16 or fp8")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp32", "bf16", "fp8"}));
  bench_cmd->add_option("--seed", bench.seed, "random seed")
      ->capture_default_str();
  bench_cmd->add_option("--transport", bench.transport,
                        "how tensors travel: inline (bytes in the message), host "
                        "(a registered shared-memory region, top-k via topk_out) or "
                        "device (GPU memory by IPC handle; GPU builds only), or ring "
                        "(as host, and the step's messages through a request ring in "
                        "shared memory instead of gRPC; daemon on this host)")
      ->capture_default_str()
      ->check(CLI::IsMember({"inline", "host", "device", "ring"}));
  bench_cmd->add_option("--ring-spin-us", bench.ring_spin_us,
                        "--transport ring: microseconds the client polls for an answer "
                        "before it sleeps on the ring's futex")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e6));
  bench_cmd->add_option("--ring-tensors", bench.ring_tensors,
                        "--transport ring: where the step's tensors live, host (a registered "
                        "shared-memory region) or device (GPU memory by IPC handle; GPU builds only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"host", "device"}));
  bench_cmd->add_option("--host-region", bench.host_region,
                        "--transport host: shm (a POSIX shared-memory object, by name) or "
                        "memfd (a memfd passed over the daemon's memfd socket)")
      ->capture_default_str()
      ->check(CLI::IsMember({"shm", "memfd"}));

  std::vector<uint64_t> release_nums;
  std::vector<std::string> release_names;
  CLI::App* release = app.add_subcommand("release", "drop sequences");
  release->add_option("--id", release_nums, "numeric sequence id (repeatable)");
  release->add_option("--name", release_names,
                      "string sequence id (repeatable)");

  HealthFlags health;
  CLI::App* health_cmd = app.add_subcommand(
      "health",
      "grpc.health.v1 Check: prints the serving status; exit 0 only when SERVING "
      "(a container HEALTHCHECK or probe command)");
  health_cmd->add_option("--service", health.service,
                         "health service name (\"\" = the daemon)");
  health_cmd->add_option("--timeout", health.timeout_s,
                         "seconds for connecting and the answer together")
      ->capture_default_str()->check(CLI::Range(0.001, 3600.0));
  CLI::App* list = app.add_subcommand("list", "this client's sequences (id, length, pages, idle)");
  SequenceFlag export_seq, import_as;
  std::string export_out, import_in;
  uint64_t export_kb = 0;
  CLI::App* export_cmd =
      app.add_subcommand("export", "write a sequence's entries (every layer) to a file");
  export_cmd->add_option("--id", export_seq.nums, "numeric sequence id");
  export_cmd->add_option("--name", export_seq.names, "string sequence id");
  export_cmd->add_option("--out", export_out, "file to write")->required();
  export_cmd->add_option("--max-message-kb", export_kb,
                         "largest message (KiB); 0 = the daemon's limit")
      ->capture_default_str();
  CLI::App* import_cmd = app.add_subcommand(
      "import", "send an export file's messages to the daemon (same profile), in order");
  import_cmd->add_option("--in", import_in, "file written by export")->required();
  import_cmd->add_option("--id", import_as.nums, "import as this numeric id instead");
  import_cmd->add_option("--name", import_as.names, "import as this string id instead");

  CLI11_PARSE(app, argc, argv);

  absl::Status status;
  if (info->parsed()) {
    status = RunInfo(global);
  } else if (demo_cmd->parsed()) {
    absl::StatusOr<bool> full = RunDemo(global, demo);
    if (full.ok()) return *full ? 0 : 1;
    status = full.status();
  } else if (bench_cmd->parsed()) {
    status = RunBench(global, bench);
  } else if (release->parsed()) {
    status = RunRelease(global, release_nums, release_names);
  } else if (health_cmd->parsed()) {
    absl::StatusOr<bool> serving = RunHealth(global, health);
    if (serving.ok()) return *serving ? 0 : 1;
    status = serving.status();
  } else if (list->parsed()) {
    status = RunList(global);
  } else if (export_cmd->parsed()) {
    status = RunExport(global, export_seq, export_out, export_kb);
  } else if (import_cmd->parsed()) {
    status = RunImport(global, import_in, import_as);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "error: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
