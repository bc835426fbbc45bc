// libFuzzer target: ExportEntries. The input's records are
// ExportEntriesRequest messages, handled as server/rpc/lifecycle_service.cc
// does (ToExport with the daemon's message limit and max_q_len, then
// Engine::Export and SequenceExport::Next until done, each chunk made into
// its WriteEntriesRequest by ExportMessage). Checked for every accepted
// request: every message stays under the request's limit; while the export
// is open the sequence cannot be released; the messages, imported in order
// as a new sequence ("fuzz-copy"), rebuild its length exactly and the
// copy's entries equal the original's, layer by layer. Failed requests
// change nothing. See fuzz_common.h for the checks after every input.
#include <string>

#include "tests/fuzz/fuzz_common.h"

namespace {

using namespace indexer;

// Every committed entry of `name` in `layer`, [entries, VB + SB] bytes.
std::string Entries(Engine& e, const SeqName& name, int32_t layer) {
  const Model& m = e.model();
  const int32_t g = m.layer_group[layer];
  const GroupSpec& gs = m.groups[g];
  const int64_t n = EntriesFor(*e.SequenceLength(name), gs.compress_ratio);
  const int64_t eb = gs.layout.entry_bytes(), E = gs.layout.page_entries;
  const std::vector<int32_t> pages = *e.SequencePages(name, g);
  std::string out(static_cast<size_t>(n * eb), '\0');
  for (int64_t i = 0; i < n; ++i) {
    absl::Status s = e.backend().ReadEntries(gs.layout, e.pool(layer), pages[i / E],
                                             static_cast<int32_t>(i % E), 1,
                                             reinterpret_cast<uint8_t*>(out.data()) + i * eb);
    if (!s.ok()) fuzz::Fail("reading entries back: " + s.ToString());
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace indexer::fuzz;
  Harness& h = Harness::Get();
  Engine& e = h.engine();
  const Model& m = e.model();
  const int64_t max_q_len = m.config.max_q_len();
  // A small daemon limit so that exports take several messages.
  const int64_t daemon_max = 16 << 10;
  const SeqName copy = SeqName::Named("fuzz-copy");
  h.Touch(copy);
  for (std::string_view rec : Records(data, size)) {
    v1::ExportEntriesRequest req;
    if (!req.ParseFromArray(rec.data(), static_cast<int>(rec.size()))) {
      h.Result(absl::InvalidArgumentError("undecodable"));
      continue;
    }
    auto args = ToExport(req, daemon_max, max_q_len);
    if (!args.ok()) {
      h.Result(args.status());
      continue;
    }
    const auto before = e.SequenceLength(args->name);
    auto ex = e.Export(args->name);
    h.Result(ex.status());
    if (!ex.ok()) {
      if (before.ok()) Fail("export of an existing sequence failed: " + ex.status().ToString());
      continue;
    }
    if (e.Release({args->name}).ok()) Fail("released a sequence being exported");
    (void)e.Release({copy});  // a copy from an earlier record
    bool failed = false;
    while (!(*ex)->done()) {
      auto chunk = (*ex)->Next(args->max_message_bytes - ExportFramingBytes(m.num_layers()),
                               args->max_tokens, "max_message_bytes");
      if (!chunk.ok()) {
        // Only a limit too small for one token may fail.
        if (chunk.status().code() != absl::StatusCode::kInvalidArgument) {
          Fail("export chunk: " + chunk.status().ToString());
        }
        h.Result(chunk.status());
        failed = true;
        break;
      }
      v1::SequenceId copy_id;
      copy_id.set_name("fuzz-copy");
      v1::WriteEntriesRequest msg = ExportMessage(m, copy_id, *chunk);
      if (static_cast<int64_t>(msg.ByteSizeLong()) > args->max_message_bytes) {
        Fail("an exported message of " + std::to_string(msg.ByteSizeLong()) +
             " bytes exceeds its limit " + std::to_string(args->max_message_bytes));
      }
      auto imp = ToImport(msg, max_q_len);
      if (!imp.ok()) Fail("an exported message does not import: " + imp.status().ToString());
      auto len = e.Import(imp->name, imp->create, imp->num_tokens, imp->layers);
      if (!len.ok()) Fail("importing an exported message: " + len.status().ToString());
    }
    ex->reset();
    if (failed) continue;
    h.Done();
    if (*e.SequenceLength(copy) != *before) Fail("the copy's length differs");
    for (int32_t l = 0; l < m.num_layers(); ++l) {
      if (Entries(e, copy, l) != Entries(e, args->name, l)) {
        Fail("layer " + std::to_string(l) + ": the copy's entries differ");
      }
    }
  }
  h.EndInput();
  return 0;
}
