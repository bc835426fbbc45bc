// Pieces shared by the indexer-cli subcommands (cli.cc, cli_demo.cc,
// cli_bench.cc). Not part of the client library.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "indexer/client.h"

namespace indexer::client::cli {

struct GlobalFlags {
  std::string addr = "127.0.0.1:50061";
  int64_t max_message_mb = 1024;
  double connect_timeout_s = 5;
  // TLS (SPEC §9): any of these set = a TLS channel.
  std::string tls_ca;           // PEM roots verifying the daemon
  std::string tls_cert;         // client certificate (mutual TLS)
  std::string tls_key;          // its key
  std::string tls_server_name;  // name checked against the daemon's certificate
  std::string client_id;        // sent as client_id_header on plaintext
  std::string client_id_header = "x-indexer-client";
  double busy_poll_us = 0;      // ClientOptions::busy_poll
};

struct DemoFlags {
  int32_t seqs = 4;
  int32_t context = 0;         // tokens per sequence imported before the prompt
  int32_t prompt = 0;          // tokens per sequence; 0 = auto (DemoPrompt)
  int32_t decode_steps = 4;
  bool q_fp32 = false;
  bool prequantized = false;
  uint64_t seed = 1;
  int32_t rows_to_print = 2;
  int32_t check_rows = 64;     // rows checked per layer per step; 0 = all
  int32_t prefill_chunk = 0;   // tokens per sequence per prefill step; 0 = auto
  std::string block_q = "bf16";  // Q form of block layers: fp32, bf16, fp8
};

struct BenchFlags {
  int32_t batch = 8;
  int32_t context = 4096;
  int32_t steps = 20;
  int32_t q_len = 1;
  int32_t warmup = 2;
  std::string layers = "all";
  bool abort_steps = false;
  std::string block_q = "bf16";
  bool q_fp32 = false;
  bool prequantized = false;
  uint64_t seed = 1;
  std::string transport = "inline";  // inline, host, device or ring
  std::string host_region = "shm";    // --transport host: shm or memfd
  double ring_spin_us = 0;            // --transport ring: the client's spin before it sleeps
  std::string ring_tensors = "host";  // --transport ring: where the tensors live (host or device)
};

struct HealthFlags {
  std::string service;   // grpc.health.v1 service name; "" = the whole daemon
  double timeout_s = 3;  // connecting and the answer together
};

absl::StatusOr<std::unique_ptr<IndexerClient>> ConnectFromFlags(
    const GlobalFlags& flags);

absl::Status RunInfo(const GlobalFlags& flags);
absl::Status RunRelease(const GlobalFlags& flags,
                        const std::vector<uint64_t>& nums,
                        const std::vector<std::string>& names);
// OK with true on full agreement, false otherwise (the report is printed).
absl::StatusOr<bool> RunDemo(const GlobalFlags& flags, const DemoFlags& demo);
absl::Status RunBench(const GlobalFlags& flags, const BenchFlags& bench);
// OK with true when the daemon answers SERVING (printed: the status name).
absl::StatusOr<bool> RunHealth(const GlobalFlags& flags, const HealthFlags& health);

// Lifecycle (cli_lifecycle.cc). A sequence on the command line: --id N or
// --name S (exactly one).
struct SequenceFlag {
  std::vector<uint64_t> nums;
  std::vector<std::string> names;
};
absl::Status RunList(const GlobalFlags& flags);
// Writes the sequence's exported WriteEntriesRequest messages to `path`,
// each behind its 4-byte little-endian length.
absl::Status RunExport(const GlobalFlags& flags, const SequenceFlag& seq, const std::string& path,
                       uint64_t max_message_kb);
// Sends the messages of an export file to the daemon, in order; `as`
// renames the sequence (empty: its exported id).
absl::Status RunImport(const GlobalFlags& flags, const std::string& path,
                       const SequenceFlag& as);

// Sequences a run created; whatever is still held is released when the set
// is destroyed (best effort, errors printed), also on error paths.
class OwnedSequences {
 public:
  explicit OwnedSequences(IndexerClient* client) : client_(client) {}
  ~OwnedSequences();
  OwnedSequences(const OwnedSequences&) = delete;
  OwnedSequences& operator=(const OwnedSequences&) = delete;

  void Add(const v1::SequenceId& id) { ids_.push_back(id); }
  // Releases every held sequence now; returns the pages released.
  absl::StatusOr<uint64_t> ReleaseAll();

 private:
  IndexerClient* client_;
  std::vector<v1::SequenceId> ids_;
};

// A short random hex tag that keeps this run's sequence names apart from
// other clients' ("indexer-cli-demo-<tag>-3").
std::string RunTag();

// Largest request this run should send: half of the smaller of the daemon's
// and the client's message limits (room for framing and the reply).
int64_t RequestBudget(const v1::ServerInfo& info, const GlobalFlags& flags);

// Nearest-rank percentile (p in [0, 100]) of `values`; 0 when empty.
double Percentile(std::vector<double> values, double p);

double MicrosSince(std::chrono::steady_clock::time_point start);

// Prints `line` in place (carriage return) at most once a second, to stderr.
class ProgressLine {
 public:
  void Update(const std::string& line, bool force = false);
  // Ends the line if anything was printed.
  void Done();

 private:
  std::chrono::steady_clock::time_point last_{};
  bool printed_ = false;
};

}  // namespace indexer::client::cli
