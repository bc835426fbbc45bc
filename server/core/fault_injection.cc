#include "server/core/fault_injection.h"

#include <utility>

#include "kernels/forwarding_backend.h"

namespace indexer {
namespace {

// Forwards everything; the layer, write and read calls fail for good once
// `ok_layers` layers have run (a device lost mid-serving).
class FaultInjectingBackend final : public ForwardingBackend {
 public:
  FaultInjectingBackend(std::unique_ptr<Backend> inner, int64_t ok_layers)
      : ForwardingBackend(std::move(inner)), layers_left_(ok_layers) {}

  std::string Describe() const override {
    return ForwardingBackend::Describe() + " [test fault injection]";
  }
  absl::StatusOr<double> WriteEntries(const PageLayout& layout, PoolHandle pool,
                                      const StepRows& rows, StepContext* ctx,
                                      const KInput& k) override {
    if (failed_.load()) return Lost("WriteEntries");
    return ForwardingBackend::WriteEntries(layout, pool, rows, ctx, k);
  }
  absl::StatusOr<LayerTimings> RunLayer(PoolHandle pool, StepContext* ctx,
                                        const LayerWork& work) override {
    if (failed_.load() || layers_left_.fetch_sub(1) <= 0) {
      failed_.store(true);
      return Lost("RunLayer");
    }
    return ForwardingBackend::RunLayer(pool, ctx, work);
  }
  absl::Status ReadEntries(const PageLayout& layout, PoolHandle pool, int32_t page,
                           int32_t first, int32_t count, uint8_t* out) override {
    if (failed_.load()) return Lost("ReadEntries");
    return ForwardingBackend::ReadEntries(layout, pool, page, first, count, out);
  }

 private:
  static absl::Status Lost(const char* call) {
    return absl::UnavailableError(absl::StrCat(
        "injected sticky device error in `", call, "` (", kDeviceFaultEnv, ", test-only)"));
  }

  std::atomic<int64_t> layers_left_;
  std::atomic<bool> failed_{false};
};

}  // namespace

std::unique_ptr<Backend> MakeFaultInjectingBackend(std::unique_ptr<Backend> inner,
                                                   int64_t ok_layers) {
  return std::make_unique<FaultInjectingBackend>(std::move(inner), ok_layers);
}

}  // namespace indexer
