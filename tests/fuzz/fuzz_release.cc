// libFuzzer target: Release. The input's records are ReleaseRequest
// messages, handled as server/rpc/service.cc does (ToReleaseNames, then
// Engine::Release). While they run, a step holds the baseline sequence
// "base-a" (q_len 1, opened before the input, dropped after it), so a
// release naming it must fail (FAILED_PRECONDITION, or NOT_FOUND for an
// unknown id listed first) and change nothing.
// See fuzz_common.h for the checks after every input.
#include <string>

#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace indexer;
  using namespace indexer::fuzz;
  Harness& h = Harness::Get();
  StepSpec held;
  held.seqs.push_back({SeqName::Named("base-a"), 1, false});
  auto step = h.engine().BeginStep(held);
  if (!step.ok()) Fail("opening the held step: " + step.status().ToString());
  const int64_t held_len = *h.engine().SequenceLength(SeqName::Named("base-a"));
  for (std::string_view rec : Records(data, size)) {
    v1::ReleaseRequest req;
    if (!req.ParseFromArray(rec.data(), static_cast<int>(rec.size()))) {
      h.Result(absl::InvalidArgumentError("undecodable"));
      continue;
    }
    auto names = ToReleaseNames(req);
    if (!names.ok()) {
      h.Result(names.status());
      continue;
    }
    bool names_held = false;
    for (const SeqName& n : *names) names_held |= n.key == SeqName::Named("base-a").key;
    auto freed = h.engine().Release(*names);
    h.Result(freed.status());
    if (freed.ok()) h.Done();
    // All or none: FAILED_PRECONDITION, or NOT_FOUND when an id before the
    // held one is unknown; never OK.
    if (names_held && freed.ok()) {
      Fail("release of a sequence in an open step succeeded; expected an error");
    }
  }
  auto len = h.engine().SequenceLength(SeqName::Named("base-a"));
  if (!len.ok() || *len != held_len) Fail("the held sequence changed under its step");
  (*step)->Abort();
  step->reset();
  h.EndInput();
  return 0;
}
