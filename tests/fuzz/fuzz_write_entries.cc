// libFuzzer target: WriteEntries (bulk import). The input's records are
// WriteEntriesRequest messages, handled as server/rpc/service.cc does
// (ToImport with the profile's max_q_len, then Engine::Import). A failed
// import must leave its sequence's length as it was. See fuzz_common.h for
// the checks after every input.
#include <string>

#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace indexer;
  using namespace indexer::fuzz;
  Harness& h = Harness::Get();
  const int64_t max_q_len = h.engine().model().config.max_q_len();
  for (std::string_view rec : Records(data, size)) {
    v1::WriteEntriesRequest req;
    if (!req.ParseFromArray(rec.data(), static_cast<int>(rec.size()))) {
      h.Result(absl::InvalidArgumentError("undecodable"));
      continue;
    }
    auto args = ToImport(req, max_q_len);
    if (!args.ok()) {
      h.Result(args.status());
      continue;
    }
    h.Touch(args->name);
    auto before = h.engine().SequenceLength(args->name);
    auto len = h.engine().Import(args->name, args->create, args->num_tokens, args->layers);
    h.Result(len.status());
    auto after = h.engine().SequenceLength(args->name);
    if (len.ok()) {
      h.Done();
      const int64_t base = before.ok() ? *before : 0;
      if (!after.ok() || *after != *len || *len != base + args->num_tokens) {
        Fail("import of " + args->name.display + " reported length " + std::to_string(*len) +
             " from " + std::to_string(base) + " + " + std::to_string(args->num_tokens));
      }
    } else if (before.ok() != after.ok() || (before.ok() && *before != *after)) {
      Fail("failed import of " + args->name.display + " changed it: " + len.status().ToString());
    }
  }
  h.EndInput();
  return 0;
}
