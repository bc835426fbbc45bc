// libFuzzer target: Step streams. The input's records are StepRequest
// messages; they are handled as server/rpc/service.cc's StepReactor does
// (header -> BeginStep, layer -> RunLayer, commit -> Commit; any error, an
// undecodable message or a second header ends the stream and rolls the step
// back). A stream ends at its commit or its first error and the next record
// starts a new one, so one input can create a sequence and then extend it;
// a stream still open at the end of the input is dropped (the client went
// away). See fuzz_common.h for the checks after every input.
#include <memory>
#include <string>

#include "tests/fuzz/fuzz_common.h"

namespace indexer::fuzz {
namespace {

class Stream {
 public:
  explicit Stream(Harness& h) : h_(h) {}
  // False when the stream has ended (committed or failed).
  bool Handle(std::string_view bytes) {
    v1::StepRequest req;
    if (!req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
      return End(absl::InvalidArgumentError("request: undecodable"));
    }
    switch (req.kind_case()) {
      case v1::StepRequest::kHeader: {
        if (step_) return End(absl::FailedPreconditionError("header: already received"));
        auto spec = ToStepSpec(req.header());
        if (!spec.ok()) return End(spec.status());
        for (const StepSequenceSpec& s : spec->seqs) h_.Touch(s.name);
        auto step = h_.engine().BeginStep(*spec);
        if (!step.ok()) return End(step.status());
        step_ = *std::move(step);
        h_.Result(absl::OkStatus());
        return true;
      }
      case v1::StepRequest::kLayer: {
        if (!step_) return End(absl::FailedPreconditionError("layer: expected the header first"));
        LayerInput in = ToLayerInput(req.layer());
        std::string topk;
        // Alternate the service's reply-buffer path with LayerOutput's.
        if (req.layer().layer() % 2 == 0) in.out_bytes = &topk;
        auto out = step_->RunLayer(in);
        if (!out.ok()) return End(out.status());
        int64_t n = 1;
        for (int64_t d : out->shape) n *= d;
        const size_t got = in.out_bytes != nullptr ? topk.size() / 4 : out->indices.size();
        if (static_cast<int64_t>(got) != n) {
          Fail("layer " + std::to_string(in.layer) + ": " + std::to_string(got) +
               " indices for a reply shape of " + std::to_string(n));
        }
        h_.Result(absl::OkStatus());
        return true;
      }
      case v1::StepRequest::kCommit: {
        if (!step_) return End(absl::FailedPreconditionError("commit: expected the header first"));
        auto lens = step_->Commit();
        if (!lens.ok()) return End(lens.status());
        h_.Result(absl::OkStatus());
        h_.Done();
        step_.reset();
        return false;
      }
      default:
        return End(absl::InvalidArgumentError("request: expected one of header, layer, commit"));
    }
  }

 private:
  bool End(const absl::Status& s) {
    if (s.ok()) Fail("End with an OK status");
    h_.Result(s);
    step_.reset();  // rolls back, as the service does before it reports
    return false;
  }
  Harness& h_;
  std::unique_ptr<Step> step_;
};

}  // namespace
}  // namespace indexer::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace indexer::fuzz;
  Harness& h = Harness::Get();
  {
    auto stream = std::make_unique<Stream>(h);
    for (std::string_view rec : Records(data, size)) {
      if (!stream->Handle(rec)) stream = std::make_unique<Stream>(h);
    }
  }  // an open stream is dropped here: the step must roll back
  h.EndInput();
  return 0;
}
