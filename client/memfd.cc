// Host regions by memfd: the memory (MemfdRegion), the side channel that
// passes its descriptor to the daemon (SendMemfd) and the registration.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "indexer/client.h"
#include "proto/memfd_wire.h"

namespace indexer::client {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<MemfdRegion> MemfdRegion::Create(const std::string& name, size_t bytes) {
  MemfdRegion r;
  r.fd_ = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (r.fd_ < 0) return Errno(absl::StrCat("memfd_create(\"", name, "\")"));
  if (ftruncate(r.fd_, static_cast<off_t>(bytes)) != 0) {
    return Errno(absl::StrCat("ftruncate(memfd \"", name, "\", ", bytes, ")"));
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd_, 0);
  if (p == MAP_FAILED) return Errno(absl::StrCat("mmap of memfd \"", name, "\""));
  r.data_ = static_cast<uint8_t*>(p);
  r.bytes_ = bytes;
  return r;
}

MemfdRegion::MemfdRegion(MemfdRegion&& o) noexcept { *this = std::move(o); }

MemfdRegion& MemfdRegion::operator=(MemfdRegion&& o) noexcept {
  if (this != &o) {
    Reset();
    fd_ = std::exchange(o.fd_, -1);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

MemfdRegion::~MemfdRegion() { Reset(); }

void MemfdRegion::Reset() {
  if (data_ != nullptr) munmap(data_, bytes_);
  if (fd_ >= 0) close(fd_);
  data_ = nullptr;
  bytes_ = 0;
  fd_ = -1;
}

absl::StatusOr<std::string> SendMemfd(const std::string& socket_path, int fd) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("memfd socket: expected a path of 1..", sizeof(addr.sun_path) - 1,
                     " bytes, got ", socket_path.size()));
  }
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) return Errno("memfd socket: socket");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{s};
  const timeval timeout{10, 0};  // a daemon that never answers
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("memfd socket ", socket_path, ": connect: ", std::strerror(errno)));
  }
  iovec iov{const_cast<char*>(memfd_wire::kHello), memfd_wire::kHelloBytes};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  cmsghdr* h = CMSG_FIRSTHDR(&msg);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(h), &fd, sizeof(int));
  if (sendmsg(s, &msg, MSG_NOSIGNAL) < 0) {
    return absl::UnavailableError(
        absl::StrCat("memfd socket ", socket_path, ": sendmsg: ", std::strerror(errno)));
  }
  char reply[memfd_wire::kMaxReplyBytes + 1];
  const ssize_t n = recv(s, reply, sizeof(reply) - 1, 0);
  if (n <= 0) {
    return absl::UnavailableError(absl::StrCat("memfd socket ", socket_path, ": no reply (",
                                               n == 0 ? "closed" : std::strerror(errno), ")"));
  }
  const std::string text(reply, static_cast<size_t>(n));
  if (absl::StartsWith(text, "ok ")) {
    std::vector<std::string> parts = absl::StrSplit(text, ' ');
    if (parts.size() == 3 && parts[1].size() == memfd_wire::kTokenHexDigits) {
      return parts[1];
    }
  } else if (absl::StartsWith(text, "error ")) {
    const std::string why = absl::StrCat("memfd socket ", socket_path, ": ", text.substr(6));
    if (absl::StrContains(text, "too many") || absl::StrContains(text, "at most")) {
      return absl::ResourceExhaustedError(why);
    }
    return absl::InvalidArgumentError(why);
  }
  return absl::InternalError(absl::StrCat("memfd socket ", socket_path,
                                          ": expected \"ok <token> <ttl_ms>\" or \"error "
                                          "...\", got ",
                                          n, " bytes of something else"));
}

absl::StatusOr<v1::RegisterRegionResponse> IndexerClient::RegisterMemfdRegion(
    const std::string& name, int fd, uint64_t offset, uint64_t bytes,
    const std::string& socket_path) {
  std::string path = socket_path;
  if (path.empty()) {
    absl::StatusOr<v1::ServerInfo> info = GetServerInfo();
    if (!info.ok()) return info.status();
    path = info->memfd_socket();
    if (path.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(address(), ": the daemon has no memfd socket (feature "
                                  "host_regions_memfd; its config memfd_socket)"));
    }
  }
  absl::StatusOr<std::string> token = SendMemfd(path, fd);
  if (!token.ok()) return token.status();
  return RegisterMemfdToken(name, *token, offset, bytes);
}

}  // namespace indexer::client
