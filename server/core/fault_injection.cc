#include "server/core/fault_injection.h"

#include <utility>

namespace indexer {
namespace {

class FaultInjectingBackend final : public Backend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, int64_t ok_layers)
      : inner_(std::move(inner)), layers_left_(ok_layers) {}

  std::string Describe() const override { return inner_->Describe() + " [test fault injection]"; }
  std::string Kind() const override { return inner_->Kind(); }
  absl::StatusOr<int64_t> FreeDeviceMemory() const override { return inner_->FreeDeviceMemory(); }
  Paths SupportedPaths() const override { return inner_->SupportedPaths(); }
  absl::StatusOr<PoolHandle> AllocatePool(const PageLayout& layout, int64_t pages) override {
    return inner_->AllocatePool(layout, pages);
  }
  absl::StatusOr<std::unique_ptr<StepContext>> PrepareStep(const PageLayout& layout,
                                                           StepRows rows) override {
    return inner_->PrepareStep(layout, std::move(rows));
  }
  absl::StatusOr<double> WriteEntries(const PageLayout& layout, PoolHandle pool,
                                      const StepRows& rows, StepContext* ctx,
                                      const KInput& k) override {
    if (failed_.load()) return Lost("WriteEntries");
    return inner_->WriteEntries(layout, pool, rows, ctx, k);
  }
  absl::StatusOr<LayerTimings> DenseTopk(const PageLayout& layout, PoolHandle pool,
                                         const StepRows& rows, StepContext* ctx, const QInput& q,
                                         int32_t topk, int32_t* out) override {
    return inner_->DenseTopk(layout, pool, rows, ctx, q, topk, out);
  }
  absl::StatusOr<LayerTimings> CandidateSource(const PageLayout& layout, PoolHandle pool,
                                               const StepRows& rows, StepContext* ctx,
                                               const QInput& q, int32_t topk,
                                               const CandidateSpec& spec, int32_t* out) override {
    return inner_->CandidateSource(layout, pool, rows, ctx, q, topk, spec, out);
  }
  absl::StatusOr<LayerTimings> CandidateConsumer(const PageLayout& layout, PoolHandle pool,
                                                 const StepRows& rows, StepContext* ctx,
                                                 const QInput& q, int32_t topk,
                                                 const CandidateSpec& spec, ConsumerMode mode,
                                                 int32_t* out) override {
    return inner_->CandidateConsumer(layout, pool, rows, ctx, q, topk, spec, mode, out);
  }
  absl::StatusOr<LayerTimings> BlockTopk(const PageLayout& layout, PoolHandle pool,
                                         const StepRows& rows, StepContext* ctx,
                                         const BlockQInput& q, const BlockSpec& spec,
                                         int32_t* out) override {
    return inner_->BlockTopk(layout, pool, rows, ctx, q, spec, out);
  }
  absl::StatusOr<LayerTimings> RunLayer(PoolHandle pool, StepContext* ctx,
                                        const LayerWork& work) override {
    if (failed_.load() || layers_left_.fetch_sub(1) <= 0) {
      failed_.store(true);
      return Lost("RunLayer");
    }
    return inner_->RunLayer(pool, ctx, work);
  }
  absl::Status CopyDeviceToHost(void* dst, const void* src, int64_t bytes) override {
    return inner_->CopyDeviceToHost(dst, src, bytes);
  }
  absl::Status ReadEntries(const PageLayout& layout, PoolHandle pool, int32_t page,
                           int32_t first, int32_t count, uint8_t* out) override {
    if (failed_.load()) return Lost("ReadEntries");
    return inner_->ReadEntries(layout, pool, page, first, count, out);
  }
  absl::StatusOr<OpenedDeviceRegion> OpenDeviceRegion(const std::string& ipc_handle,
                                                      const std::string& device_uuid,
                                                      const std::string& pci_bus_id,
                                                      uint64_t offset, uint64_t bytes) override {
    return inner_->OpenDeviceRegion(ipc_handle, device_uuid, pci_bus_id, offset, bytes);
  }
  absl::Status CloseDeviceRegion(void* base) override { return inner_->CloseDeviceRegion(base); }

 private:
  static absl::Status Lost(const char* call) {
    return absl::UnavailableError(absl::StrCat(
        "injected sticky device error in `", call, "` (", kDeviceFaultEnv, ", test-only)"));
  }

  const std::unique_ptr<Backend> inner_;
  std::atomic<int64_t> layers_left_;
  std::atomic<bool> failed_{false};
};

}  // namespace

std::unique_ptr<Backend> MakeFaultInjectingBackend(std::unique_ptr<Backend> inner,
                                                   int64_t ok_layers) {
  return std::make_unique<FaultInjectingBackend>(std::move(inner), ok_layers);
}

}  // namespace indexer
