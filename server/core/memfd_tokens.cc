#include "server/core/memfd_tokens.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/memfd_wire.h"

namespace indexer {
namespace {

constexpr uint64_t kDefaultTtlMs = 10000;
constexpr size_t kMaxRetired = 4096;
constexpr size_t kTokenBytes = 16;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string FileKind(mode_t mode) {
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// "/memfd:<name> (deleted)" -> "memfd:<name>"; "" when `fd` is no memfd.
std::string MemfdName(int fd) {
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  char target[512];
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return "";
  std::string t(target, static_cast<size_t>(n));
  if (!absl::StartsWith(t, "/memfd:")) return "";
  if (absl::EndsWith(t, " (deleted)")) t.resize(t.size() - std::strlen(" (deleted)"));
  // Names are the sender's text: escaped before they reach lists and logs.
  return "memfd:" + absl::CHexEscape(t.substr(std::strlen("/memfd:")));
}

// The checks of Issue on a descriptor it holds; the name on success.
absl::StatusOr<std::string> CheckMemfd(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("fd: fstat failed: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd: expected a memfd (memfd_create), got ", FileKind(st.st_mode)));
  }
  std::string name = MemfdName(fd);
  if (name.empty()) {
    return absl::InvalidArgumentError(
        "fd: expected a memfd (memfd_create), got a regular file of a file system");
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError("fd: expected a memfd open read-write, got a read-only one");
  }
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("fd: F_GET_SEALS failed: ", std::strerror(errno)));
  }
  int write_seals = F_SEAL_WRITE;
#ifdef F_SEAL_FUTURE_WRITE
  write_seals |= F_SEAL_FUTURE_WRITE;
#endif
  if (seals & write_seals) {
    return absl::InvalidArgumentError(
        "fd: expected a writable memfd, got one sealed against writes (the daemon writes "
        "topk_out there)");
  }
  if (!(seals & F_SEAL_SHRINK) && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fd: expected a memfd that can be sealed against shrinking (memfd_create with "
        "MFD_ALLOW_SEALING) or already is; F_ADD_SEALS(F_SEAL_SHRINK): ",
        std::strerror(errno)));
  }
  return name;
}

bool IsTokenText(absl::string_view t) {
  if (t.size() != memfd_wire::kTokenHexDigits) return false;
  for (char c : t) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

MemfdTokens::MemfdTokens(uint64_t ttl_ms, NowMs now)
    : ttl_ms_(ttl_ms == 0 ? kDefaultTtlMs : ttl_ms), now_(now ? std::move(now) : SteadyMs) {}

MemfdTokens::~MemfdTokens() {
  absl::MutexLock lock(&mu_);
  for (auto& [token, h] : held_) close(h.claim.fd);
}

absl::Status MemfdTokens::CheckRoomLocked(uint32_t uid) const {
  auto it = per_uid_.find(uid);
  const bool mine = it != per_uid_.end() && it->second >= kMaxTokensPerUid;
  if (!mine && held_.size() < kMaxTokens) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "fd: too many memfds waiting for RegisterRegion (", mine ? kMaxTokensPerUid : kMaxTokens,
      mine ? " for this uid" : "", "); register them or let their tokens expire (", ttl_ms_,
      " ms)"));
}

absl::StatusOr<std::string> MemfdTokens::Issue(int fd, uint32_t uid, int32_t pid) {
  // The room first, so that a refusal leaves the memfd unsealed; checked
  // again when the token goes in.
  {
    const int64_t now = now_();
    absl::MutexLock lock(&mu_);
    ExpireLocked(now);
    if (absl::Status room = CheckRoomLocked(uid); !room.ok()) {
      close(fd);
      return room;
    }
  }
  absl::StatusOr<std::string> name = CheckMemfd(fd);
  if (!name.ok()) {
    close(fd);
    return name.status();
  }
  unsigned char raw[kTokenBytes];
  if (getrandom(raw, sizeof(raw), 0) != static_cast<ssize_t>(sizeof(raw))) {
    close(fd);
    return absl::InternalError(absl::StrCat("token: getrandom failed: ", std::strerror(errno)));
  }
  std::string token = absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)));
  const int64_t now = now_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  if (absl::Status room = CheckRoomLocked(uid); !room.ok()) {
    close(fd);
    return room;
  }
  ++per_uid_[uid];
  held_[token] = Held{MemfdClaim{fd, uid, pid, *std::move(name)},
                      now + static_cast<int64_t>(ttl_ms_)};
  return token;
}

absl::StatusOr<uint64_t> MemfdTokens::Redeem(
    absl::string_view field, absl::string_view token, std::optional<uint32_t> caller_uid,
    const std::function<absl::StatusOr<uint64_t>(const MemfdClaim&)>& use) {
  if (!IsTokenText(token)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected ", memfd_wire::kTokenHexDigits,
        " lowercase hex digits (the memfd socket's reply), got ", token.size(), " bytes"));
  }
  const int64_t now = now_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = held_.find(token);
  if (it == held_.end()) {
    auto r = retired_.find(token);
    if (r != retired_.end()) {
      return absl::NotFoundError(absl::StrCat(field, ": token ", r->second));
    }
    return absl::NotFoundError(
        absl::StrCat(field, ": unknown token (no memfd was passed with it)"));
  }
  const MemfdClaim& claim = it->second.claim;
  if (caller_uid.has_value() && *caller_uid != claim.uid) {
    return absl::PermissionDeniedError(absl::StrCat(field, ": the memfd was passed by uid ",
                                                    claim.uid, ", the caller is uid ",
                                                    *caller_uid));
  }
  // Under the lock: a second redemption of the token waits and then finds
  // it spent. `use` only maps (short) and takes the registry's lock, never
  // this one.
  absl::StatusOr<uint64_t> id = use(claim);
  if (!id.ok()) return id.status();
  close(claim.fd);
  if (--per_uid_[claim.uid] == 0) per_uid_.erase(claim.uid);
  const std::string spent(token);
  held_.erase(it);
  RetireLocked(spent, "already used (a token registers one region)");
  return id;
}

void MemfdTokens::Expire() {
  const int64_t now = now_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
}

size_t MemfdTokens::size() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

void MemfdTokens::ExpireLocked(int64_t now) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (now >= it->second.expires_ms) {
      close(it->second.claim.fd);
      const uint32_t uid = it->second.claim.uid;
      if (--per_uid_[uid] == 0) per_uid_.erase(uid);
      RetireLocked(it->first, "expired (not registered in time; its memfd was closed)");
      held_.erase(it++);
    } else {
      ++it;
    }
  }
}

void MemfdTokens::RetireLocked(const std::string& token, const char* why) {
  if (retired_order_.size() >= kMaxRetired) {
    retired_.erase(retired_order_.front());
    retired_order_.pop_front();
  }
  retired_[token] = why;
  retired_order_.push_back(token);
}

}  // namespace indexer
