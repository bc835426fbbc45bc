// indexer-cli list / export / import: the lifecycle calls from a shell. An
// export file is the sequence's WriteEntriesRequest messages, each behind
// its 4-byte little-endian length; `import` sends them in order, to the
// same or another daemon of the same profile (the prefill -> decode
// hand-off by hand).
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/cli_common.h"
#include "kernels/common/status_macros.h"

namespace indexer::client::cli {
namespace {

absl::StatusOr<v1::SequenceId> OneSequence(const SequenceFlag& seq, bool required) {
  const size_t n = seq.nums.size() + seq.names.size();
  if (n == 0 && !required) return v1::SequenceId();
  if (n != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--id / --name: expected exactly one sequence, got ", n));
  }
  return seq.nums.empty() ? NamedSequenceId(seq.names[0]) : NumericSequenceId(seq.nums[0]);
}

}  // namespace

absl::Status RunList(const GlobalFlags& flags) {
  ASSIGN_OR_RETURN(std::unique_ptr<IndexerClient> client, ConnectFromFlags(flags));
  std::string token;
  size_t count = 0;
  do {
    ASSIGN_OR_RETURN(v1::ListSequencesResponse page, client->ListSequences(0, token));
    for (const v1::SequenceInfo& s : page.sequences()) {
      std::string pages;
      for (uint64_t p : s.pages()) absl::StrAppend(&pages, pages.empty() ? "" : ",", p);
      std::printf("%-24s length %-10" PRIu64 " pages [%s] idle %" PRIu64 " ms%s\n",
                  SequenceIdString(s.id()).c_str(), s.length(), pages.c_str(), s.idle_ms(),
                  s.busy() ? " (in a step)" : "");
      ++count;
    }
    token = page.next_page_token();
  } while (!token.empty());
  std::printf("%zu sequence(s)\n", count);
  return absl::OkStatus();
}

absl::Status RunExport(const GlobalFlags& flags, const SequenceFlag& seq, const std::string& path,
                       uint64_t max_message_kb) {
  ASSIGN_OR_RETURN(v1::SequenceId id, OneSequence(seq, true));
  ASSIGN_OR_RETURN(std::unique_ptr<IndexerClient> client, ConnectFromFlags(flags));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InvalidArgumentError(absl::StrCat("--out: cannot write ", path));
  v1::ExportEntriesRequest req;
  *req.mutable_id() = id;
  req.set_max_message_bytes(max_message_kb << 10);
  size_t messages = 0;
  uint64_t tokens = 0;
  RETURN_IF_ERROR(client->ExportEntries(req, [&](v1::WriteEntriesRequest& m) -> absl::Status {
    const std::string bytes = m.SerializeAsString();
    const uint32_t n = static_cast<uint32_t>(bytes.size());
    const char len[4] = {static_cast<char>(n), static_cast<char>(n >> 8),
                         static_cast<char>(n >> 16), static_cast<char>(n >> 24)};
    out.write(len, 4);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out) return absl::DataLossError(absl::StrCat("--out: writing ", path, " failed"));
    ++messages;
    tokens += m.num_tokens();
    return absl::OkStatus();
  }));
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("--out: writing ", path, " failed"));
  std::printf("exported %s: %" PRIu64 " tokens in %zu message(s) to %s\n",
              SequenceIdString(id).c_str(), tokens, messages, path.c_str());
  return absl::OkStatus();
}

absl::Status RunImport(const GlobalFlags& flags, const std::string& path,
                       const SequenceFlag& as) {
  ASSIGN_OR_RETURN(v1::SequenceId rename, OneSequence(as, false));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("--in: cannot read ", path));
  ASSIGN_OR_RETURN(std::unique_ptr<IndexerClient> client, ConnectFromFlags(flags));
  size_t messages = 0;
  uint64_t len = 0;
  unsigned char head[4];
  while (in.read(reinterpret_cast<char*>(head), 4)) {
    const uint32_t n = head[0] | (head[1] << 8) | (head[2] << 16) | (uint32_t{head[3]} << 24);
    std::string bytes(n, '\0');
    v1::WriteEntriesRequest m;
    if (!in.read(bytes.data(), n) || !m.ParseFromString(bytes)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--in: message ", messages, " of ", path, " is cut short or does not decode"));
    }
    if (rename.id_case() != v1::SequenceId::ID_NOT_SET) *m.mutable_id() = rename;
    ASSIGN_OR_RETURN(len, client->WriteEntries(m));
    ++messages;
  }
  if (messages == 0) {
    return absl::InvalidArgumentError(absl::StrCat("--in: ", path, " holds no message"));
  }
  std::printf("imported %zu message(s): the sequence holds %" PRIu64 " tokens\n", messages, len);
  return absl::OkStatus();
}

}  // namespace indexer::client::cli
