#include "client/cli_transport.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/shm_region.h"
#include "kernels/common/status_macros.h"

#if defined(INDEXER_CLI_GPU)
#include "kernels/gpu/gpu_compat.h"
#endif

namespace indexer::client::cli {
namespace {

uint64_t Align16(uint64_t x) { return (x + 15) & ~uint64_t{15}; }

class InlineTransport final : public BenchTransport {
 public:
  const char* name() const override { return "inline"; }
  absl::Status Prepare(v1::LayerRequest*, int64_t) override { return absl::OkStatus(); }
  absl::Status CheckReply(const v1::LayerReply& reply, int64_t topk_bytes) const override {
    if (static_cast<int64_t>(reply.topk().data().size()) != topk_bytes) {
      return absl::InternalError(absl::StrCat("reply topk: expected ", topk_bytes,
                                              " bytes, got ", reply.topk().data().size()));
    }
    return absl::OkStatus();
  }
};

// Memory the bench shares with the daemon, registered as one region.
class RegionMemory {
 public:
  virtual ~RegionMemory() = default;
  virtual size_t size() const = 0;
  // Copies `n` bytes to `offset`; complete (visible to the daemon) on return.
  virtual absl::Status Write(uint64_t offset, const void* data, size_t n) = 0;
  // Registers the memory; returns the region id.
  virtual absl::StatusOr<uint64_t> Register(IndexerClient* client) = 0;
};

class HostMemory final : public RegionMemory {
 public:
  static absl::StatusOr<std::unique_ptr<RegionMemory>> Create(size_t bytes) {
    std::random_device rd;
    const std::string name = absl::StrCat("/indexer-cli-bench-", getpid(), "-", rd());
    ASSIGN_OR_RETURN(ShmRegion shm, ShmRegion::Create(name, bytes));
    auto m = std::make_unique<HostMemory>();
    m->shm_ = std::move(shm);
    return std::unique_ptr<RegionMemory>(std::move(m));
  }
  size_t size() const override { return shm_.size(); }
  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    std::memcpy(shm_.data() + offset, data, n);
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Register(IndexerClient* client) override {
    ASSIGN_OR_RETURN(v1::RegisterRegionResponse r,
                     client->RegisterHostRegion("indexer-cli-bench", shm_.name(), 0, size()));
    return r.region();
  }

 private:
  ShmRegion shm_;
};

// A memfd passed over the daemon's memfd socket (the one ServerInfo names).
class MemfdMemory final : public RegionMemory {
 public:
  static absl::StatusOr<std::unique_ptr<RegionMemory>> Create(size_t bytes) {
    ASSIGN_OR_RETURN(MemfdRegion memfd, MemfdRegion::Create("indexer-cli-bench", bytes));
    auto m = std::make_unique<MemfdMemory>();
    m->memfd_ = std::move(memfd);
    return std::unique_ptr<RegionMemory>(std::move(m));
  }
  size_t size() const override { return memfd_.size(); }
  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    std::memcpy(memfd_.data() + offset, data, n);
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Register(IndexerClient* client) override {
    ASSIGN_OR_RETURN(v1::RegisterRegionResponse r,
                     client->RegisterMemfdRegion("indexer-cli-bench", memfd_.fd(), 0, size()));
    return r.region();
  }

 private:
  MemfdRegion memfd_;
};

#if defined(INDEXER_CLI_GPU)
#define CLI_GPU_CHECK(expr)                                                     \
  do {                                                                          \
    const ::indexer::gpu::Error _e = (expr);                                    \
    if (_e != ::indexer::gpu::kSuccess) {                                       \
      return ::indexer::gpu::ErrorStatus(_e, #expr, __FILE__, __LINE__);        \
    }                                                                           \
  } while (0)

// Device memory of the current device, exported by IPC handle.
class DeviceMemory final : public RegionMemory {
 public:
  static absl::StatusOr<std::unique_ptr<RegionMemory>> Create(size_t bytes) {
    auto m = std::make_unique<DeviceMemory>();
    void* p = nullptr;
    CLI_GPU_CHECK(gpu::Malloc(&p, bytes));
    m->data_ = static_cast<uint8_t*>(p);
    m->bytes_ = bytes;
    return std::unique_ptr<RegionMemory>(std::move(m));
  }
  ~DeviceMemory() override {
    if (data_ != nullptr) (void)gpu::Free(data_);
  }
  size_t size() const override { return bytes_; }
  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    // The ordering contract: the writes are complete before the request goes.
    CLI_GPU_CHECK(gpu::CopyH2D(data_ + offset, data, n, gpu::Stream{}));
    CLI_GPU_CHECK(gpu::StreamSynchronize(gpu::Stream{}));
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Register(IndexerClient* client) override {
    gpu::IpcMemHandle handle;
    CLI_GPU_CHECK(gpu::IpcGetMemHandle(&handle, data_));
    int device = 0;
    std::string uuid;
    CLI_GPU_CHECK(gpu::DeviceUuidString(&uuid, device));
    ASSIGN_OR_RETURN(v1::RegisterRegionResponse r,
                     client->RegisterDeviceRegion(
                         "indexer-cli-bench",
                         std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)),
                         uuid, "", 0, bytes_));
    return r.region();
  }

 private:
  uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};
#endif

// Tensors by reference: each layer's tensors are written into the region
// from offset 0 (16-byte aligned), then the top-k span; the region grows
// (a new one, registered again) when a layer needs more.
class RegionTransport final : public BenchTransport {
 public:
  using Factory = absl::StatusOr<std::unique_ptr<RegionMemory>> (*)(size_t);
  RegionTransport(const char* name, Factory factory, IndexerClient* client)
      : name_(name), factory_(factory), client_(client) {}
  ~RegionTransport() override { Drop(); }

  const char* name() const override { return name_; }

  absl::Status Prepare(v1::LayerRequest* r, int64_t topk_bytes) override {
    std::vector<v1::Tensor*> tensors;
    if (r->has_k()) tensors.push_back(r->mutable_k());
    if (r->has_q()) tensors.push_back(r->mutable_q());
    if (r->has_q_scale()) tensors.push_back(r->mutable_q_scale());
    if (r->has_weights()) tensors.push_back(r->mutable_weights());
    uint64_t need = 0;
    for (const v1::Tensor* t : tensors) need = Align16(need + t->data().size());
    RETURN_IF_ERROR(Reserve(need + static_cast<uint64_t>(topk_bytes)));
    uint64_t at = 0;
    for (v1::Tensor* t : tensors) {
      const size_t n = t->data().size();
      RETURN_IF_ERROR(memory_->Write(at, t->data().data(), n));
      t->clear_data();
      *t->mutable_ref() = MakeTensorRef(region_, at, n);
      at = Align16(at + n);
    }
    *r->mutable_topk_out() = MakeTensorRef(region_, at, static_cast<uint64_t>(topk_bytes));
    return absl::OkStatus();
  }

  absl::Status CheckReply(const v1::LayerReply& reply, int64_t) const override {
    if (!reply.topk().data().empty()) {
      return absl::InternalError(absl::StrCat("reply topk: expected no bytes (topk_out), got ",
                                              reply.topk().data().size()));
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Reserve(uint64_t bytes) {
    if (memory_ && memory_->size() >= bytes) return absl::OkStatus();
    Drop();
    // Page-multiple sizes, with room to spare for the next larger layer.
    const uint64_t size = ((bytes + bytes / 4 + 4095) / 4096) * 4096;
    ASSIGN_OR_RETURN(memory_, factory_(size));
    ASSIGN_OR_RETURN(region_, memory_->Register(client_));
    return absl::OkStatus();
  }
  void Drop() {
    if (!memory_) return;
    absl::Status s = client_->UnregisterRegion(region_);
    if (!s.ok()) std::fprintf(stderr, "warning: unregister region: %s\n", s.ToString().c_str());
    memory_.reset();
  }

  const char* name_;
  Factory factory_;
  IndexerClient* client_;
  std::unique_ptr<RegionMemory> memory_;
  uint64_t region_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BenchTransport>> MakeBenchTransport(
    const std::string& kind, const std::string& host_region, IndexerClient* client) {
  if (kind == "inline") return std::make_unique<InlineTransport>();
  if (kind == "host" && host_region == "memfd") {
    return std::make_unique<RegionTransport>("host (memfd)", &MemfdMemory::Create, client);
  }
  if (kind == "host") {
    if (host_region != "shm") {
      return absl::InvalidArgumentError(
          absl::StrCat("--host-region: expected shm or memfd, got \"", host_region, "\""));
    }
    return std::make_unique<RegionTransport>("host", &HostMemory::Create, client);
  }
  if (kind == "device") {
#if defined(INDEXER_CLI_GPU)
    return std::make_unique<RegionTransport>("device", &DeviceMemory::Create, client);
#else
    return absl::FailedPreconditionError(
        "--transport device: this indexer-cli was built without a GPU runtime (GPU=OFF); "
        "build with GPU=AUTO/CUDA/HIP");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--transport: expected inline, host or device, got \"", kind, "\""));
}

}  // namespace indexer::client::cli
