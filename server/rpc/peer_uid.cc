#include "server/rpc/peer_uid.h"

#include <arpa/inet.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"

namespace indexer {
namespace {

// The kernel prints each 32-bit word of an address as the host reads it
// (%08X of the __be32), and the port in hex: "0100007F:D431".
std::string ProcV4(const in_addr& a, uint16_t port) {
  uint32_t w;
  std::memcpy(&w, &a, 4);
  return absl::StrFormat("%08X:%04X", w, port);
}

std::string ProcV6(const in6_addr& a, uint16_t port) {
  uint32_t w[4];
  std::memcpy(w, &a, 16);
  return absl::StrFormat("%08X%08X%08X%08X:%04X", w[0], w[1], w[2], w[3], port);
}

// The uid column of the ESTABLISHED socket whose local address is `local`
// in the table `file`; nothing when absent or ambiguous.
std::optional<uint32_t> FindUid(const char* file, const std::string& local) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);  // header
  std::optional<uint32_t> found;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, loc, rem, st, queues, timer, retr, uid;
    if (!(f >> sl >> loc >> rem >> st >> queues >> timer >> retr >> uid)) continue;
    if (st != "01" || !absl::EqualsIgnoreCase(loc, local)) continue;
    uint32_t u;
    if (!absl::SimpleAtoi(uid, &u)) continue;
    if (found.has_value() && *found != u) return std::nullopt;
    found = u;
  }
  return found;
}

}  // namespace

PeerUid LookupPeerUid(absl::string_view peer) {
  PeerUid out;
  if (absl::StartsWith(peer, "unix:")) {
    out.kind = PeerUid::kUnix;
    return out;
  }
  const bool v4 = absl::StartsWith(peer, "ipv4:");
  const bool v6 = absl::StartsWith(peer, "ipv6:");
  if (!v4 && !v6) return out;
  out.kind = PeerUid::kTcp;
  std::string rest(peer.substr(5));
  rest = absl::StrReplaceAll(rest, {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}});
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) return out;
  uint32_t port = 0;
  if (!absl::SimpleAtoi(rest.substr(colon + 1), &port) || port > 65535) return out;
  std::string host = rest.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  if (const size_t pct = host.find('%'); pct != std::string::npos) host.resize(pct);  // zone
  if (v4) {
    in_addr a{};
    if (inet_pton(AF_INET, host.c_str(), &a) != 1) return out;
    out.uid = FindUid("/proc/net/tcp", ProcV4(a, static_cast<uint16_t>(port)));
    if (!out.uid.has_value()) {
      // A client socket of AF_INET6 reaching an IPv4 address: ::ffff:a.b.c.d.
      in6_addr m{};
      m.s6_addr[10] = m.s6_addr[11] = 0xff;
      std::memcpy(&m.s6_addr[12], &a, 4);
      out.uid = FindUid("/proc/net/tcp6", ProcV6(m, static_cast<uint16_t>(port)));
    }
    return out;
  }
  in6_addr a{};
  if (inet_pton(AF_INET6, host.c_str(), &a) != 1) return out;
  out.uid = FindUid("/proc/net/tcp6", ProcV6(a, static_cast<uint16_t>(port)));
  if (!out.uid.has_value() && IN6_IS_ADDR_V4MAPPED(&a)) {
    in_addr v{};
    std::memcpy(&v, &a.s6_addr[12], 4);
    out.uid = FindUid("/proc/net/tcp", ProcV4(v, static_cast<uint16_t>(port)));
  }
  return out;
}

}  // namespace indexer
