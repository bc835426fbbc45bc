// A Backend that forwards every call to another one: the base of wrappers
// that change a few calls (fault injection, test gates) and must not drop
// the rest. A method added to Backend gets its one forwarder here.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "kernels/backend.h"

namespace indexer {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  std::string Describe() const override { return inner_->Describe(); }
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
    return inner_->RunLayer(pool, ctx, work);
  }
  absl::Status CopyDeviceToHost(void* dst, const void* device_src, int64_t bytes) override {
    return inner_->CopyDeviceToHost(dst, device_src, bytes);
  }
  absl::Status ReadEntries(const PageLayout& layout, PoolHandle pool, int32_t page,
                           int32_t first, int32_t count, uint8_t* out) override {
    return inner_->ReadEntries(layout, pool, page, first, count, out);
  }
  absl::StatusOr<OpenedDeviceRegion> OpenDeviceRegion(const std::string& ipc_handle,
                                                      const std::string& device_uuid,
                                                      const std::string& pci_bus_id,
                                                      uint64_t offset, uint64_t bytes) override {
    return inner_->OpenDeviceRegion(ipc_handle, device_uuid, pci_bus_id, offset, bytes);
  }
  absl::Status CloseDeviceRegion(void* base) override { return inner_->CloseDeviceRegion(base); }
  HostBufferPool& host_buffers() override { return inner_->host_buffers(); }

 protected:
  Backend& inner() const { return *inner_; }

 private:
  std::unique_ptr<Backend> inner_;
};

}  // namespace indexer
