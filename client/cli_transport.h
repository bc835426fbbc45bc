// How indexer-cli bench moves a layer's tensors (--transport): inline bytes
// in the message, or references to a region the bench registered (a host
// shared-memory object, or device memory exported by IPC handle) with the
// top-k written back through topk_out. Not part of the client library.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "indexer/client.h"

namespace indexer::client::cli {

class BenchTransport {
 public:
  virtual ~BenchTransport() = default;
  virtual const char* name() const = 0;
  // Turns `request`'s inline tensors into what goes on the wire: for region
  // transports, writes them into the region (as a front-end producing them
  // there would), references them and names topk_out (`topk_bytes`).
  virtual absl::Status Prepare(v1::LayerRequest* request, int64_t topk_bytes) = 0;
  // Checks the reply's top-k arrived where this transport expects it.
  virtual absl::Status CheckReply(const v1::LayerReply& reply, int64_t topk_bytes) const = 0;
};

// "inline", "host" or "device" (device: builds with a GPU runtime only,
// FAILED_PRECONDITION otherwise); a host region is `host_region` "shm" or
// "memfd". Region transports register their region with `client` and
// unregister it when destroyed.
absl::StatusOr<std::unique_ptr<BenchTransport>> MakeBenchTransport(
    const std::string& kind, const std::string& host_region, IndexerClient* client);

}  // namespace indexer::client::cli
