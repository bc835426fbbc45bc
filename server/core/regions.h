// Registered regions of the data plane (SPEC §6): memory a client shares
// with the daemon so that tensors travel by reference instead of inline. No
// gRPC here; server/rpc maps the wire messages onto this registry.
//
// Ownership: a region belongs to the client identity that registered it.
// Every call names the caller; a region of another owner looks exactly like
// an unknown one (NOT_FOUND naming the id), so ids reveal nothing.
//
// Lifetime: a region is dropped on Unregister or when unused for the lease.
// A Lookup returns a PinnedRegion that holds the mapping itself (not the
// registry entry): unregistering or expiring a region while a layer still
// holds a pin only unlists it; the unmap happens when the last pin goes
// (deferred unmap, never a use after free).
//
// Expiry runs on every registry call (Register, Unregister, List, Lookup):
// each call first drops every region whose last use is older than the
// lease, then does its work. There is no background thread: a daemon that
// receives no calls keeps its regions mapped until the next call (of any
// client), which is when the expiry is observable anyway.
//
// Thread safety: RegionRegistry is thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"

namespace indexer {

// One mapping of a region: host memory from mmap, or device memory opened
// from an IPC handle. Unmapped (munmap / Backend::CloseDeviceRegion) by its
// destructor, which runs when the registry and every pin have let go.
class RegionMapping {
 public:
  virtual ~RegionMapping() = default;
  uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  bool on_device() const { return on_device_; }

 protected:
  RegionMapping(uint8_t* data, uint64_t bytes, bool on_device)
      : data_(data), bytes_(bytes), on_device_(on_device) {}

 private:
  uint8_t* data_;
  uint64_t bytes_;
  bool on_device_;
};

// [offset, offset + bytes) of region `region`, as TensorRef names it.
struct RegionSpan {
  uint64_t region = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// Bytes of a region, kept mapped as long as this (or a copy) lives.
struct PinnedRegion {
  std::shared_ptr<const RegionMapping> hold;
  uint8_t* data = nullptr;  // host address, or device address when on_device
  uint64_t bytes = 0;
  bool on_device = false;
};

struct DeviceRegionSpec {
  std::string ipc_handle;  // the handle's bytes
  std::string device_uuid;
  std::string pci_bus_id;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct RegionListing {
  uint64_t region = 0;
  std::string name;
  std::string kind;   // "host" or "device"
  uint64_t bytes = 0;
  std::string where;  // shm name, or the device
  uint64_t idle_ms = 0;
};

class RegionRegistry {
 public:
  // Milliseconds of a monotonic clock; injectable for tests.
  using NowMs = std::function<int64_t()>;
  static int64_t SteadyNowMs();

  // `backend` opens device regions (may be null: device regions then fail
  // with FAILED_PRECONDITION); it must outlive the registry and every pin.
  // `lease_ms` 0 = the default, 300000.
  RegionRegistry(Backend* backend, uint64_t lease_ms, NowMs now = SteadyNowMs);
  ~RegionRegistry();

  uint64_t lease_ms() const { return lease_ms_; }

  // Maps [offset, offset + bytes) of the POSIX shared-memory object
  // `shm_name` read-write. INVALID_ARGUMENT: empty name or shm_name, a name
  // over 128 bytes, zero bytes, an offset that is not a multiple of the page
  // size, an object smaller than offset + bytes; NOT_FOUND: no such object.
  // Errors name the wire fields (name, host.shm_name, host.offset, host.bytes).
  absl::StatusOr<uint64_t> RegisterHost(const std::string& owner, const std::string& name,
                                        const std::string& shm_name, uint64_t offset,
                                        uint64_t bytes);
  // Maps [offset, offset + bytes) of the memfd `fd` (not taken: the caller
  // closes it; the mapping keeps the memory) as a host region listed with
  // `where` ("memfd:<name> (pid N)"). The same checks and errors as
  // RegisterHost, naming host.offset and host.bytes ("the memfd's size").
  absl::StatusOr<uint64_t> RegisterHostFd(const std::string& owner, const std::string& name,
                                          int fd, uint64_t offset, uint64_t bytes,
                                          const std::string& where);
  // Opens a device region through the backend (see Backend::OpenDeviceRegion).
  absl::StatusOr<uint64_t> RegisterDevice(const std::string& owner, const std::string& name,
                                          const DeviceRegionSpec& spec);

  // NOT_FOUND unless `owner` holds `region`.
  absl::Status Unregister(const std::string& owner, uint64_t region);

  // The owner's regions, by id; renews each of them.
  std::vector<RegionListing> List(const std::string& owner);

  // The bytes `span` names, pinned, renewing the region. `field` prefixes
  // errors ("q.ref"). NOT_FOUND ("<field>.region: region 7 not found")
  // for an unknown, released, expired or other owner's region;
  // INVALID_ARGUMENT for an offset not a multiple of 16 or a span past the
  // region's end.
  absl::StatusOr<PinnedRegion> Lookup(const std::string& owner, absl::string_view field,
                                      const RegionSpan& span);

  // Whether `owner` still holds `region` (after expiry), without renewing
  // it: a request ring polls its region with this while it sleeps.
  bool Holds(const std::string& owner, uint64_t region);

  // Regions of every owner (tests and metrics).
  size_t size() const;

 private:
  struct Entry {
    std::string owner;
    std::string name;
    std::string kind;
    std::string where;
    std::shared_ptr<const RegionMapping> mapping;
    int64_t last_use_ms = 0;
  };
  absl::Status CheckName(const std::string& name) const;
  // The checks shared by both host forms (name, bytes, offset alignment).
  absl::Status CheckHost(const std::string& name, uint64_t offset, uint64_t bytes) const;
  // Maps an open descriptor of a host region; errors say "<what> (<size>
  // bytes of <of>)".
  absl::StatusOr<uint64_t> MapHost(const std::string& owner, const std::string& name, int fd,
                                   uint64_t offset, uint64_t bytes, const char* what,
                                   const std::string& of, const std::string& where);
  uint64_t Insert(const std::string& owner, const std::string& name, const char* kind,
                  const std::string& where, std::shared_ptr<const RegionMapping> mapping);
  // Drops expired regions; their mappings go once unpinned.
  void ExpireLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Backend* const backend_;
  const uint64_t lease_ms_;
  const NowMs now_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> regions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace indexer
