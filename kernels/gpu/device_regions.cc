// Device regions of the data plane (SPEC §6): GPU memory another process
// exported with an IPC handle, opened on the backend's device. Every runtime
// call goes through gpu_compat.h.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "kernels/gpu/gpu_backend_impl.h"

namespace indexer {
namespace gpu {
namespace {

// Bus ids compare without case and with the domain optional ("19:00.0").
std::string NormalizeBusId(const std::string& id) {
  std::string s = absl::AsciiStrToLower(id);
  if (std::count(s.begin(), s.end(), ':') == 1) s = "0000:" + s;
  // The runtime prints an 8-digit domain on some versions ("00000000:19:00.0").
  const size_t colon = s.find(':');
  if (colon != std::string::npos && colon > 4) s = s.substr(colon - 4);
  return s;
}

}  // namespace

absl::StatusOr<Backend::OpenedDeviceRegion> GpuBackend::OpenDeviceRegion(
    const std::string& ipc_handle, const std::string& device_uuid,
    const std::string& pci_bus_id, uint64_t offset, uint64_t bytes) {
  if (ipc_handle.size() != sizeof(IpcMemHandle)) {
    return absl::InvalidArgumentError(absl::StrCat("device.ipc_handle: expected ",
                                                   sizeof(IpcMemHandle), " bytes, got ",
                                                   ipc_handle.size()));
  }
  if (device_uuid.empty() && pci_bus_id.empty()) {
    return absl::InvalidArgumentError(
        "device.device_uuid: expected the device's UUID or device.pci_bus_id, got neither");
  }
  GPU_RETURN_IF_ERROR(SetDevice(ordinal_));
  // The named device among those this process sees.
  int count = 0;
  GPU_RETURN_IF_ERROR(GetDeviceCount(&count));
  int device = -1;
  std::string where;
  for (int d = 0; d < count && device < 0; ++d) {
    if (!device_uuid.empty()) {
      std::string uuid;
      GPU_RETURN_IF_ERROR(DeviceUuidString(&uuid, d));
      if (absl::EqualsIgnoreCase(uuid, device_uuid)) {
        device = d;
        where = device_uuid;
      }
    } else {
      char bus[64] = {};
      GPU_RETURN_IF_ERROR(DevicePciBusId(bus, sizeof(bus), d));
      if (NormalizeBusId(bus) == NormalizeBusId(pci_bus_id)) {
        device = d;
        where = pci_bus_id;
      }
    }
  }
  const std::string named =
      device_uuid.empty() ? absl::StrCat("device.pci_bus_id \"", pci_bus_id, "\"")
                          : absl::StrCat("device.device_uuid \"", device_uuid, "\"");
  if (device < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        named, ": no such device visible to the daemon (", count,
        " devices); expected the daemon's device ", kRuntimeName, ":", ordinal_,
        " or one with peer access to it"));
  }
  if (device != ordinal_) {
    int can = 0;
    GPU_RETURN_IF_ERROR(DeviceCanAccessPeer(&can, ordinal_, device));
    if (!can) {
      return absl::FailedPreconditionError(absl::StrCat(
          named, ": device ", kRuntimeName, ":", device, " has no peer access to the daemon's "
          "device ", kRuntimeName, ":", ordinal_));
    }
    GPU_RETURN_IF_ERROR(DeviceEnablePeerAccess(device));
  }
  IpcMemHandle handle;
  std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
  void* base = nullptr;
  const Error e = IpcOpenMemHandle(&base, handle);
  if (e != kSuccess) {
    (void)GetLastError();  // not sticky: clear it for the next call
    if (IsSticky(e)) return ErrorStatus(e, "IpcOpenMemHandle", __FILE__, __LINE__);
    return absl::InvalidArgumentError(absl::StrCat(
        "device.ipc_handle: the handle does not open on ", kRuntimeName, ":", ordinal_, " (",
        ErrorString(e), "); expected the bytes of a live IPC memory handle"));
  }
  // The declared span must lie inside the exported allocation: reads or
  // writes past it would reach other memory of the exporting process.
  void* alloc = nullptr;
  size_t alloc_bytes = 0;
  const Error r = MemAddressRange(&alloc, &alloc_bytes, base);
  if (r == kSuccess) {
    const uint64_t avail =
        alloc_bytes - static_cast<uint64_t>(static_cast<uint8_t*>(base) - static_cast<uint8_t*>(alloc));
    if (offset > avail || bytes > avail - offset) {
      (void)IpcCloseMemHandle(base);
      return absl::InvalidArgumentError(absl::StrCat(
          "device.bytes: offset ", offset, " + bytes ", bytes, " = ", offset + bytes,
          "; expected at most the exported allocation's ", avail, " bytes"));
    }
  } else {
    (void)GetLastError();  // not checkable on this driver: the caller's word
  }
  OpenedDeviceRegion out;
  out.base = base;
  out.data = static_cast<uint8_t*>(base) + offset;
  out.device = absl::StrCat(kRuntimeName, ":", device, " ", where);
  return out;
}

absl::Status GpuBackend::CloseDeviceRegion(void* base) {
  GPU_RETURN_IF_ERROR(SetDevice(ordinal_));
  GPU_RETURN_IF_ERROR(IpcCloseMemHandle(base));
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer
