// Backend::OpenDeviceRegion on the gpu backend: the checks of a device
// region (handle size, the named device, garbage handle bytes) and a real
// handle exported by another process (ipc_export_helper), read back through
// the opened pointer. Skips without a GPU.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gpu/gpu_backend.h"
#include "kernels/gpu/gpu_compat.h"

namespace indexer {
namespace {

#define REQUIRE_GPU()                                                    \
  if (GpuDeviceCount() == 0) {                                           \
    GTEST_SKIP() << "no GPU: GpuDeviceCount() == 0 on this machine";     \
  }

std::string OwnUuid() {
  std::string uuid;
  EXPECT_EQ(gpu::DeviceUuidString(&uuid, 0), gpu::kSuccess);
  return uuid;
}

void ExpectStatus(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(std::string(s.message()).find(text), std::string::npos) << s;
}

TEST(DeviceRegionsTest, Checks) {
  REQUIRE_GPU();
  auto b = MakeGpuBackend(0, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  const std::string garbage(sizeof(gpu::IpcMemHandle), '\x5a');
  ExpectStatus((*b)->OpenDeviceRegion("short", OwnUuid(), "", 0, 64).status(),
               absl::StatusCode::kInvalidArgument, "device.ipc_handle: expected 64 bytes, got 5");
  ExpectStatus((*b)->OpenDeviceRegion(garbage, "", "", 0, 64).status(),
               absl::StatusCode::kInvalidArgument, "device.device_uuid");
  ExpectStatus((*b)->OpenDeviceRegion(garbage, "GPU-00000000-0000-0000-0000-000000000000", "",
                                      0, 64).status(),
               absl::StatusCode::kFailedPrecondition, "no such device");
  ExpectStatus((*b)->OpenDeviceRegion(garbage, OwnUuid(), "", 0, 64).status(),
               absl::StatusCode::kInvalidArgument, "device.ipc_handle: the handle does not open");
  char bus[64] = {};
  ASSERT_EQ(gpu::DevicePciBusId(bus, sizeof(bus), 0), gpu::kSuccess);
  ExpectStatus((*b)->OpenDeviceRegion(garbage, "", bus, 0, 64).status(),
               absl::StatusCode::kInvalidArgument, "device.ipc_handle: the handle does not open");
  // The backend still works after the failed opens (no sticky error).
  ASSERT_EQ(gpu::GetLastError(), gpu::kSuccess);
}

TEST(DeviceRegionsTest, OpensAHandleOfAnotherProcess) {
  REQUIRE_GPU();
  auto b = MakeGpuBackend(0, 0);
  ASSERT_TRUE(b.ok()) << b.status();
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  posix_spawn_file_actions_addclose(&fa, to_child[1]);
  posix_spawn_file_actions_addclose(&fa, from_child[0]);
  const char* argv[] = {INDEXER_IPC_HELPER, "65536", nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, INDEXER_IPC_HELPER, &fa, nullptr, const_cast<char**>(argv),
                        environ),
            0);
  posix_spawn_file_actions_destroy(&fa);
  close(to_child[0]);
  close(from_child[1]);
  FILE* in = fdopen(from_child[0], "r");
  char line[512] = {};
  ASSERT_NE(std::fgets(line, sizeof(line), in), nullptr) << "the helper printed nothing";
  std::string hex, uuid;
  {
    std::string s(line);
    const size_t sp = s.find(' ');
    ASSERT_NE(sp, std::string::npos);
    hex = s.substr(0, sp);
    uuid = s.substr(sp + 1);
    while (!uuid.empty() && (uuid.back() == '\n' || uuid.back() == '\r')) uuid.pop_back();
  }
  ASSERT_EQ(hex.size(), 2 * sizeof(gpu::IpcMemHandle));
  std::string handle(sizeof(gpu::IpcMemHandle), '\0');
  for (size_t i = 0; i < handle.size(); ++i) {
    handle[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  // A span past the exported allocation (64 KiB, whatever the driver's
  // rounding: 1 GiB is past it) is refused and leaves nothing open.
  auto past = (*b)->OpenDeviceRegion(handle, uuid, "", 4096, uint64_t{1} << 30);
  ASSERT_FALSE(past.ok());
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument) << past.status();
  EXPECT_NE(past.status().message().find("device.bytes"), std::string::npos) << past.status();
  auto opened = (*b)->OpenDeviceRegion(handle, uuid, "", 4096, 1024);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->data, static_cast<uint8_t*>(opened->base) + 4096);
  std::vector<unsigned char> back(1024);
  ASSERT_EQ(gpu::CopyD2H(back.data(), opened->data, back.size(), gpu::Stream{}), gpu::kSuccess);
  ASSERT_EQ(gpu::StreamSynchronize(gpu::Stream{}), gpu::kSuccess);
  for (size_t i = 0; i < back.size(); ++i) {
    ASSERT_EQ(back[i], static_cast<unsigned char>((4096 + i) * 7 + 3)) << "byte " << i;
  }
  EXPECT_TRUE((*b)->CloseDeviceRegion(opened->base).ok());
  close(to_child[1]);  // the helper frees its memory and exits
  std::fclose(in);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

}  // namespace
}  // namespace indexer
