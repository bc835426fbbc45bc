#include "indexer/routing.h"

#include <algorithm>
#include <functional>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace indexer::client {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;
constexpr uint64_t kFnvPrime = 0x100000001b3ULL;

uint64_t Fnv1a(uint64_t h, const std::string& bytes) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= kFnvPrime;
  }
  return h;
}

// FNV-1a alone mixes the last bytes poorly into the high bits; the
// finalizer spreads every input bit over the whole word.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::string Key(const v1::SequenceId& id) {
  return id.id_case() == v1::SequenceId::kNum ? absl::StrCat("#", id.num())
                                               : absl::StrCat("$", id.name());
}

}  // namespace

uint64_t RendezvousWeight(const std::string& daemon, const v1::SequenceId& id) {
  uint64_t h = Fnv1a(kFnvOffset, daemon);
  h = Fnv1a(h, std::string(1, '\0'));
  return Mix(Fnv1a(h, Key(id)));
}

size_t PickDaemon(const std::vector<std::string>& daemons, const v1::SequenceId& id) {
  size_t best = 0;
  uint64_t best_w = 0;
  for (size_t i = 0; i < daemons.size(); ++i) {
    const uint64_t w = RendezvousWeight(daemons[i], id);
    if (i == 0 || w > best_w) {
      best = i;
      best_w = w;
    }
  }
  return best;
}

absl::StatusOr<std::unique_ptr<RoutedClient>> RoutedClient::Connect(
    const std::vector<std::string>& addresses, const ClientOptions& options) {
  if (addresses.empty()) {
    return absl::InvalidArgumentError("addresses: expected at least one daemon address");
  }
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (!seen.insert(addresses[i]).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "addresses[", i, "]: \"", addresses[i], "\" is listed twice; expected each daemon once"));
    }
  }
  std::unique_ptr<RoutedClient> rc(new RoutedClient());
  rc->addresses_ = addresses;
  for (const std::string& a : addresses) {
    absl::StatusOr<std::unique_ptr<IndexerClient>> c = IndexerClient::Connect(a, options);
    if (!c.ok()) return c.status();
    rc->clients_.push_back(*std::move(c));
  }
  return rc;
}

std::vector<RoutedClient::Part> RoutedClient::Step(const v1::StepHeader& batch,
                                                   const std::vector<uint32_t>& layers,
                                                   const LayerBuilder& build) {
  std::vector<Part> parts;
  std::vector<int> part_of(size(), -1);
  for (int i = 0; i < batch.sequences_size(); ++i) {
    const size_t d = DaemonFor(batch.sequences(i).id());
    if (part_of[d] < 0) {
      part_of[d] = static_cast<int>(parts.size());
      parts.emplace_back();
      parts.back().daemon = d;
    }
    parts[part_of[d]].sequences.push_back(static_cast<size_t>(i));
  }
  std::sort(parts.begin(), parts.end(),
            [](const Part& a, const Part& b) { return a.daemon < b.daemon; });
  auto run = [&](Part& part) {
    part.status = [&]() -> absl::Status {
      v1::StepHeader header;
      header.set_request_id(batch.request_id());
      for (size_t i : part.sequences) *header.add_sequences() = batch.sequences(i);
      absl::StatusOr<std::unique_ptr<StepSession>> step = clients_[part.daemon]->OpenStep(header);
      if (!step.ok()) return step.status();
      for (uint32_t layer : layers) {
        absl::StatusOr<v1::LayerRequest> request = build(part.daemon, part.sequences, layer);
        if (!request.ok()) return request.status();  // ~StepSession aborts
        absl::StatusOr<v1::LayerReply> reply = (*step)->RunLayer(*std::move(request));
        if (!reply.ok()) return reply.status();
        part.replies.push_back(*std::move(reply));
      }
      absl::StatusOr<v1::StepCommitted> committed = (*step)->Commit();
      if (!committed.ok()) return committed.status();
      part.committed = *std::move(committed);
      return absl::OkStatus();
    }();
    if (!part.status.ok()) {
      part.status = absl::Status(part.status.code(), absl::StrCat("daemon ", part.daemon, " (",
                                                                  addresses_[part.daemon], "): ",
                                                                  part.status.message()));
    }
  };
  // This thread runs the first part; one more thread per other part.
  std::vector<std::thread> threads;
  for (size_t p = 1; p < parts.size(); ++p) threads.emplace_back(run, std::ref(parts[p]));
  if (!parts.empty()) run(parts[0]);
  for (std::thread& t : threads) t.join();
  return parts;
}

absl::StatusOr<uint64_t> RoutedClient::Release(const std::vector<v1::SequenceId>& ids) {
  std::vector<std::vector<v1::SequenceId>> by_daemon(size());
  for (const v1::SequenceId& id : ids) by_daemon[DaemonFor(id)].push_back(id);
  uint64_t pages = 0;
  for (size_t d = 0; d < size(); ++d) {
    if (by_daemon[d].empty()) continue;
    absl::StatusOr<uint64_t> released = clients_[d]->Release(by_daemon[d]);
    if (!released.ok()) return released.status();
    pages += *released;
  }
  return pages;
}

}  // namespace indexer::client
