#include "server/rpc/memfd_socket.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "proto/memfd_wire.h"
#include "spdlog/spdlog.h"

namespace indexer {
namespace {

// Descriptors one message may carry before the kernel truncates (all but
// one are refused anyway; room for more lets the reply say how many came).
constexpr size_t kMaxFds = 16;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Conn {
  int fd = -1;
  uint32_t uid = 0;
  int32_t pid = 0;
  int64_t last_ms = 0;
};

void Reply(int fd, const std::string& text) {
  const std::string capped = text.substr(0, memfd_wire::kMaxReplyBytes);
  // A client that went away or stopped reading loses its reply, nothing more.
  (void)send(fd, capped.data(), capped.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Serves one message of `c`; false when the connection is done (EOF, an
// error, or garbage, which got its "error" reply).
bool HandleMessage(const Conn& c, MemfdTokens* tokens) {
  char buf[64];
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFds)];
  iovec iov{buf, sizeof(buf)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  const ssize_t n = recvmsg(c.fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  std::vector<int> fds;
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof(int));
      fds.push_back(fd);
    }
  }
  if (n == 0 && fds.empty()) return false;  // EOF
  std::string error;
  if (msg.msg_flags & MSG_CTRUNC) {
    error = absl::StrCat("fds: expected exactly one descriptor (SCM_RIGHTS), got more than ",
                         fds.size());
  } else if ((msg.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) != memfd_wire::kHelloBytes ||
             std::memcmp(buf, memfd_wire::kHello, memfd_wire::kHelloBytes) != 0) {
    error = absl::StrCat("message: expected the ", memfd_wire::kHelloBytes, " bytes \"",
                         memfd_wire::kHello, "\", got ",
                         (msg.msg_flags & MSG_TRUNC) ? "more than " : "", n,
                         " bytes of something else");
  } else if (fds.size() != 1) {
    error = absl::StrCat("fds: expected exactly one descriptor (SCM_RIGHTS), got ", fds.size());
  }
  if (!error.empty()) {
    for (int fd : fds) close(fd);
    spdlog::info("memfd socket: refused a message of uid {} pid {}: {}", c.uid, c.pid, error);
    Reply(c.fd, "error " + error);
    return false;
  }
  absl::StatusOr<std::string> token = tokens->Issue(fds[0], c.uid, c.pid);  // takes the fd
  if (!token.ok()) {
    spdlog::info("memfd socket: refused a memfd of uid {} pid {}: {}", c.uid, c.pid,
                 std::string(token.status().message()));
    Reply(c.fd, absl::StrCat("error ", token.status().message()));
    return false;
  }
  Reply(c.fd, absl::StrCat("ok ", *token, " ", tokens->ttl_ms()));
  return true;
}

}  // namespace

std::string MemfdSocketPath(const std::string& configured, const std::string& listen) {
  if (configured == "off") return "";
  if (!configured.empty()) return configured;
  if (!absl::StartsWith(listen, "unix:")) return "";
  std::string path = listen.substr(std::strlen("unix:"));
  if (absl::StartsWith(path, "//")) path = path.substr(2);  // unix:///abs
  return path.empty() ? "" : path + ".fd";
}

absl::StatusOr<std::unique_ptr<MemfdSocket>> MemfdSocket::Start(const std::string& path,
                                                                MemfdTokens* tokens) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("memfd_socket: expected a path of 1..",
                                                   sizeof(addr.sun_path) - 1, " bytes, got ",
                                                   path.size()));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  struct stat st {};
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("memfd_socket: ", path, " exists and is not a socket"));
    }
    unlink(path.c_str());  // left by a daemon that did not stop cleanly
  }
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("memfd_socket: socket: ", std::strerror(errno)));
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(path.c_str(), 0666) != 0 || listen(fd, 64) != 0) {
    const int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("memfd_socket: cannot listen on ", path, ": ", std::strerror(err)));
  }
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    const int err = errno;
    close(fd);
    unlink(path.c_str());
    return absl::InternalError(absl::StrCat("memfd_socket: eventfd: ", std::strerror(err)));
  }
  std::unique_ptr<MemfdSocket> s(new MemfdSocket(path, tokens, fd, wake));
  s->thread_ = std::thread([raw = s.get()] { raw->Loop(); });
  return s;
}

MemfdSocket::MemfdSocket(std::string path, MemfdTokens* tokens, int listen_fd, int wake_fd)
    : path_(std::move(path)), tokens_(tokens), listen_fd_(listen_fd), wake_fd_(wake_fd) {}

MemfdSocket::~MemfdSocket() { Stop(); }

void MemfdSocket::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void MemfdSocket::Loop() {
  std::vector<Conn> conns;
  // Expiry of unclaimed memfds runs at least this often.
  const int tick_ms = static_cast<int>(std::clamp<uint64_t>(tokens_->ttl_ms() / 4, 10, 1000));
  std::vector<pollfd> pfds;
  for (;;) {
    pfds.assign({{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    for (const Conn& c : conns) pfds.push_back({c.fd, POLLIN, 0});
    const int ready = poll(pfds.data(), pfds.size(), tick_ms);
    if (ready < 0 && errno != EINTR) {
      spdlog::error("memfd socket: poll: {}; no more memfds", std::strerror(errno));
      break;
    }
    if (pfds[0].revents != 0) break;
    const int64_t now = NowMs();
    // Connections first (their pollfds are pfds[2...]), then new ones.
    std::vector<Conn> kept;
    for (size_t i = 0; i < conns.size(); ++i) {
      Conn& c = conns[i];
      const short ev = ready > 0 ? pfds[i + 2].revents : 0;
      bool keep = true;
      if (ev & POLLIN) {
        c.last_ms = now;
        keep = HandleMessage(c, tokens_);
      } else if (ev & (POLLHUP | POLLERR | POLLNVAL)) {
        keep = false;
      } else if (now - c.last_ms > kIdleMs) {
        keep = false;
      }
      if (keep) {
        kept.push_back(c);
      } else {
        close(c.fd);
      }
    }
    conns.swap(kept);
    if (ready > 0 && (pfds[1].revents & POLLIN)) {
      for (;;) {
        const int cfd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (cfd < 0) break;
        ucred cred{};
        socklen_t len = sizeof(cred);
        if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
          close(cfd);
          continue;
        }
        if (conns.size() >= static_cast<size_t>(kMaxConnections)) {
          Reply(cfd, absl::StrCat("error connections: at most ", kMaxConnections,
                                  " at once; try again"));
          close(cfd);
          continue;
        }
        conns.push_back({cfd, static_cast<uint32_t>(cred.uid), static_cast<int32_t>(cred.pid),
                         now});
      }
    }
    tokens_->Expire();
  }
  for (const Conn& c : conns) close(c.fd);
}

}  // namespace indexer
