// Several daemons behind one client (issue 13 item 3; README "Several
// daemons"): each sequence belongs to one daemon, chosen from its id by
// rendezvous (highest random weight) hashing, so that adding a daemon to n
// moves only the ~1/(n+1) of the sequences that the new one wins, and
// removing one moves only its own. A batch is grouped by daemon and each
// group runs as one step on its daemon, the groups in parallel.
//
// Atomicity is per daemon: every daemon's step commits or rolls back as a
// whole (SPEC §6), but one daemon's failure does not roll back another's
// commit. The caller sees each part's outcome and decides (retry the failed
// part's sequences, or release them everywhere).
//
// The Python package implements the same hash (indexer_client/routing.py):
// both route an id to the same daemon given the same address list.
//
// Thread safety: RoutedClient is thread-safe as IndexerClient is.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "indexer/client.h"

namespace indexer::client {

// The weight of `daemon` (its address string, as given) for sequence `id`:
// FNV-1a over the address, a 0 byte and the id's key ("#<num>" or
// "$<name>"), then the splitmix64 finalizer.
uint64_t RendezvousWeight(const std::string& daemon, const v1::SequenceId& id);

// The index in `daemons` of the daemon that owns `id`: the highest weight,
// ties to the lower index. REQUIRES: `daemons` is not empty.
size_t PickDaemon(const std::vector<std::string>& daemons, const v1::SequenceId& id);

class RoutedClient {
 public:
  // Connects to every address (ClientOptions apply to each); the first
  // failure is returned. INVALID_ARGUMENT for an empty or repeated address.
  static absl::StatusOr<std::unique_ptr<RoutedClient>> Connect(
      const std::vector<std::string>& addresses, const ClientOptions& options = {});

  size_t size() const { return clients_.size(); }
  const std::vector<std::string>& addresses() const { return addresses_; }
  IndexerClient& daemon(size_t i) { return *clients_[i]; }
  size_t DaemonFor(const v1::SequenceId& id) const { return PickDaemon(addresses_, id); }

  // One daemon's share of a routed step.
  struct Part {
    size_t daemon = 0;
    std::vector<size_t> sequences;       // indices into the batch, batch order
    absl::Status status;                 // OK: committed; else rolled back
    std::vector<v1::LayerReply> replies;  // one per layer run, in `layers` order
    v1::StepCommitted committed;         // lengths, in `sequences` order
  };
  // Builds daemon `daemon`'s request of layer `layer` for its sequences
  // (indices into the batch, batch order: its rows are theirs, in that
  // order). Called from one thread per daemon, concurrently.
  using LayerBuilder = std::function<absl::StatusOr<v1::LayerRequest>(
      size_t daemon, const std::vector<size_t>& sequences, uint32_t layer)>;

  // Groups `batch`'s sequences by daemon and runs, on every daemon with at
  // least one, a step over its group: its header (request_id kept), then
  // `layers` in order, each built by `build`, then commit. The daemons run
  // in parallel (one thread each). Returns the parts in daemon order.
  std::vector<Part> Step(const v1::StepHeader& batch, const std::vector<uint32_t>& layers,
                         const LayerBuilder& build);

  // Releases each id on its daemon. Returns the pages released in total, or
  // the first error (other daemons' releases stand).
  absl::StatusOr<uint64_t> Release(const std::vector<v1::SequenceId>& ids);

 private:
  RoutedClient() = default;
  std::vector<std::string> addresses_;
  std::vector<std::unique_ptr<IndexerClient>> clients_;
};

}  // namespace indexer::client
