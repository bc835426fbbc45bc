#include "server/core/regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace indexer {
namespace {

constexpr uint64_t kDefaultLeaseMs = 300000;
constexpr uint64_t kRefAlignment = 16;
constexpr size_t kMaxNameBytes = 128;

class HostMapping final : public RegionMapping {
 public:
  HostMapping(void* addr, uint64_t bytes)
      : RegionMapping(static_cast<uint8_t*>(addr), bytes, false) {}
  ~HostMapping() override { munmap(data(), bytes()); }
};

class DeviceMapping final : public RegionMapping {
 public:
  DeviceMapping(Backend* backend, void* base, uint8_t* data, uint64_t bytes)
      : RegionMapping(data, bytes, true), backend_(backend), base_(base) {}
  // A close that fails leaves the handle open until the process ends; there
  // is nobody left to tell.
  ~DeviceMapping() override { (void)backend_->CloseDeviceRegion(base_); }

 private:
  Backend* backend_;
  void* base_;
};

}  // namespace

int64_t RegionRegistry::SteadyNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

RegionRegistry::RegionRegistry(Backend* backend, uint64_t lease_ms, NowMs now)
    : backend_(backend),
      lease_ms_(lease_ms == 0 ? kDefaultLeaseMs : lease_ms),
      now_(std::move(now)) {}

RegionRegistry::~RegionRegistry() = default;

absl::Status RegionRegistry::CheckName(const std::string& name) const {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("name: expected 1..", kMaxNameBytes,
                                                   " bytes, got ", name.size()));
  }
  return absl::OkStatus();
}

absl::Status RegionRegistry::CheckHost(const std::string& name, uint64_t offset,
                                       uint64_t bytes) const {
  RETURN_IF_ERROR(CheckName(name));
  if (bytes == 0) return absl::InvalidArgumentError("host.bytes: expected >= 1, got 0");
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (offset % page != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host.offset: expected a multiple of the page size (", page, "), got ", offset));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RegionRegistry::RegisterHost(const std::string& owner,
                                                      const std::string& name,
                                                      const std::string& shm_name,
                                                      uint64_t offset, uint64_t bytes) {
  RETURN_IF_ERROR(CheckName(name));
  if (shm_name.empty()) {
    return absl::InvalidArgumentError(
        "host.shm_name: expected a shared-memory object name (\"/name\"), got \"\"");
  }
  RETURN_IF_ERROR(CheckHost(name, offset, bytes));
  const int fd = shm_open(shm_name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat("host.shm_name: no shared-memory object \"",
                                              shm_name, "\""));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "host.shm_name: cannot open \"", shm_name, "\" read-write: ", std::strerror(err)));
  }
  auto id = MapHost(owner, name, fd, offset, bytes, "the object's size",
                    absl::StrCat("\"", shm_name, "\""), shm_name);
  close(fd);  // the mapping keeps the object alive
  return id;
}

absl::StatusOr<uint64_t> RegionRegistry::RegisterHostFd(const std::string& owner,
                                                        const std::string& name, int fd,
                                                        uint64_t offset, uint64_t bytes,
                                                        const std::string& where) {
  RETURN_IF_ERROR(CheckHost(name, offset, bytes));
  return MapHost(owner, name, fd, offset, bytes, "the memfd's size", where, where);
}

absl::StatusOr<uint64_t> RegionRegistry::MapHost(const std::string& owner,
                                                 const std::string& name, int fd,
                                                 uint64_t offset, uint64_t bytes,
                                                 const char* what, const std::string& of,
                                                 const std::string& where) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return absl::InternalError(
        absl::StrCat("host: fstat of ", where, " failed: ", std::strerror(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const std::string limit = absl::StrCat(what, " (", size, " bytes of ", of, ")");
  if (offset >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("host.offset: expected < ", limit, ", got ", offset));
  }
  if (bytes > size - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host.bytes: expected offset + bytes <= ", limit, ", got ", offset, " + ", bytes));
  }
  void* addr = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                    static_cast<off_t>(offset));
  if (addr == MAP_FAILED) {
    return absl::ResourceExhaustedError(absl::StrCat("host: cannot map ", bytes, " bytes of ",
                                                     where, ": ", std::strerror(errno)));
  }
  return Insert(owner, name, "host", where, std::make_shared<HostMapping>(addr, bytes));
}

absl::StatusOr<uint64_t> RegionRegistry::RegisterDevice(const std::string& owner,
                                                        const std::string& name,
                                                        const DeviceRegionSpec& spec) {
  RETURN_IF_ERROR(CheckName(name));
  if (spec.bytes == 0) return absl::InvalidArgumentError("device.bytes: expected >= 1, got 0");
  // Reference offsets are multiples of 16 from the region's start, and the
  // kernels load device tensors 16 bytes at a time: a region starting off
  // that grid would fault them (a sticky device error for every client).
  if (spec.offset % kRefAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device.offset: expected a multiple of ", kRefAlignment, ", got ", spec.offset));
  }
  if (backend_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "region \"", name, "\": device regions need the gpu backend (no backend)"));
  }
  auto opened = backend_->OpenDeviceRegion(spec.ipc_handle, spec.device_uuid, spec.pci_bus_id,
                                           spec.offset, spec.bytes);
  if (!opened.ok()) {
    return absl::Status(opened.status().code(),
                        absl::StrCat("region \"", name, "\": ", opened.status().message()));
  }
  return Insert(owner, name, "device", opened->device,
                std::make_shared<DeviceMapping>(backend_, opened->base, opened->data,
                                                spec.bytes));
}

uint64_t RegionRegistry::Insert(const std::string& owner, const std::string& name,
                                const char* kind, const std::string& where,
                                std::shared_ptr<const RegionMapping> mapping) {
  const int64_t now = now_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  const uint64_t id = next_id_++;
  regions_[id] = Entry{owner, name, kind, where, std::move(mapping), now};
  return id;
}

absl::Status RegionRegistry::Unregister(const std::string& owner, uint64_t region) {
  std::shared_ptr<const RegionMapping> dropped;  // unmapped outside the lock
  const int64_t now = now_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = regions_.find(region);
  if (it == regions_.end() || it->second.owner != owner) {
    return absl::NotFoundError(absl::StrCat("region: region ", region, " not found"));
  }
  dropped = std::move(it->second.mapping);
  regions_.erase(it);
  return absl::OkStatus();
}

std::vector<RegionListing> RegionRegistry::List(const std::string& owner) {
  const int64_t now = now_();
  std::vector<RegionListing> out;
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  for (auto& [id, e] : regions_) {
    if (e.owner != owner) continue;
    out.push_back({id, e.name, e.kind, e.mapping->bytes(), e.where,
                   static_cast<uint64_t>(std::max<int64_t>(0, now - e.last_use_ms))});
    e.last_use_ms = now;
  }
  std::sort(out.begin(), out.end(),
            [](const RegionListing& a, const RegionListing& b) { return a.region < b.region; });
  return out;
}

absl::StatusOr<PinnedRegion> RegionRegistry::Lookup(const std::string& owner,
                                                   absl::string_view field,
                                                   const RegionSpan& span) {
  const int64_t now = now_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = regions_.find(span.region);
  if (it == regions_.end() || it->second.owner != owner) {
    return absl::NotFoundError(
        absl::StrCat(field, ".region: region ", span.region, " not found"));
  }
  Entry& e = it->second;
  if (span.offset % kRefAlignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".offset: expected a multiple of ",
                                                   kRefAlignment, ", got ", span.offset));
  }
  const uint64_t size = e.mapping->bytes();
  if (span.offset > size || span.bytes > size - span.offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".bytes: expected offset + bytes <= ", size, " (the size of region ",
        span.region, "), got ", span.offset, " + ", span.bytes));
  }
  e.last_use_ms = now;
  PinnedRegion p;
  p.hold = e.mapping;
  p.data = e.mapping->data() + span.offset;
  p.bytes = span.bytes;
  p.on_device = e.mapping->on_device();
  return p;
}

bool RegionRegistry::Holds(const std::string& owner, uint64_t region) {
  const int64_t now = now_();
  absl::MutexLock lock(&mu_);
  ExpireLocked(now);
  auto it = regions_.find(region);
  return it != regions_.end() && it->second.owner == owner;
}

size_t RegionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return regions_.size();
}

void RegionRegistry::ExpireLocked(int64_t now) {
  // Mappings still pinned by a layer live on in its PinnedRegion; the rest
  // are unmapped here, under the lock (munmap is short; a device close waits
  // for nothing the registry holds).
  for (auto it = regions_.begin(); it != regions_.end();) {
    if (now - it->second.last_use_ms >= static_cast<int64_t>(lease_ms_)) {
      regions_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace indexer
