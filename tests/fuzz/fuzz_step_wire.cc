// libFuzzer target of the skeleton StepRequest reader (server/rpc/
// step_wire.h). An input is one StepRequest cut into slices: records as in
// fuzz_common.h (a 4-byte little-endian length, then that many bytes), each
// record one slice, in order. For every input the reader must agree with
// protobuf's parse of the joined bytes: both fail (with the handler's
// error), or both succeed with the same message once the reader's spans are
// put back into their tensors. A mismatch aborts.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "google/protobuf/stubs/logging.h"
#include "server/rpc/step_wire.h"

namespace {

struct Stats {
  long inputs = 0, parsed = 0, skeleton = 0;
};
Stats& GetStats() {
  static Stats* s = [] {
    google::protobuf::SetLogHandler(nullptr);  // the parser's failures are expected
    auto* st = new Stats;
    if (std::getenv("INDEXER_FUZZ_STATS") != nullptr) {
      std::atexit([] {
        const Stats& s = GetStats();
        // run.sh's format: "took effect" = requests the skeleton read.
        std::printf("fuzz stats: inputs %ld, operations ok %ld, rejected %ld, took effect %ld\n",
                    s.inputs, s.parsed, s.inputs - s.parsed, s.skeleton);
        std::fflush(stdout);
      });
    }
    return st;
  }();
  return *s;
}

[[noreturn]] void Fail(const char* why) {
  std::fprintf(stderr, "fuzz invariant: %s\n", why);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Stats& stats = GetStats();
  ++stats.inputs;
  std::vector<absl::string_view> chunks;
  std::string joined;
  size_t pos = 0;
  while (size - pos >= 4) {
    uint32_t n = 0;
    std::memcpy(&n, data + pos, 4);
    pos += 4;
    const size_t take = n < size - pos ? n : size - pos;
    chunks.emplace_back(reinterpret_cast<const char*>(data + pos), take);
    joined.append(reinterpret_cast<const char*>(data + pos), take);
    pos += take;
  }
  indexer::v1::StepRequest want;
  const bool want_ok = want.ParseFromString(joined);
  indexer::StepWire w;
  const absl::Status got = indexer::ReadStepRequest(chunks, &w);
  if (got.ok() != want_ok) Fail(want_ok ? "reader failed, protobuf parsed" : "reader parsed, protobuf failed");
  if (!got.ok()) {
    if (got != absl::InvalidArgumentError("request: expected a StepRequest message")) {
      Fail("reader's error differs from the handler's");
    }
    return 0;
  }
  ++stats.parsed;
  if (w.skeleton) ++stats.skeleton;
  if (indexer::Materialize(chunks, w).SerializeAsString() != want.SerializeAsString()) {
    Fail("reader's message differs from protobuf's");
  }
  return 0;
}
