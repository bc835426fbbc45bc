// A second process for device_regions_test (an IPC handle cannot be opened
// by the process that exported it): allocates `bytes` on device 0, fills
// byte i with (i * 7 + 3) & 255, prints "<handle hex> <device uuid>" and a
// newline, then holds the memory until its stdin closes.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/gpu/gpu_compat.h"

int main(int argc, char** argv) {
  using namespace indexer::gpu;  // NOLINT: a test helper's main
  const size_t bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1 << 20;
  void* p = nullptr;
  std::vector<unsigned char> host(bytes);
  for (size_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>(i * 7 + 3);
  IpcMemHandle handle;
  std::string uuid;
  if (SetDevice(0) != kSuccess || Malloc(&p, bytes) != kSuccess ||
      CopyH2D(p, host.data(), bytes, Stream{}) != kSuccess ||
      StreamSynchronize(Stream{}) != kSuccess || IpcGetMemHandle(&handle, p) != kSuccess ||
      DeviceUuidString(&uuid, 0) != kSuccess) {
    std::fprintf(stderr, "ipc_export_helper: %s\n", ErrorString(GetLastError()));
    return 1;
  }
  const unsigned char* h = reinterpret_cast<const unsigned char*>(&handle);
  for (size_t i = 0; i < sizeof(handle); ++i) std::printf("%02x", h[i]);
  std::printf(" %s\n", uuid.c_str());
  std::fflush(stdout);
  while (std::fgetc(stdin) != EOF) {
  }
  (void)Free(p);
  return 0;
}
