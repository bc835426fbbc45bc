#include "server/install_paths.h"

#include <filesystem>
#include <system_error>

// Set by server/CMakeLists.txt: the profiles' folder relative to the
// installed binary's folder, and the source tree's.
#ifndef INDEXER_CONFIG_DIR_FROM_BIN
#define INDEXER_CONFIG_DIR_FROM_BIN "../share/indexerd/configs"
#endif
#ifndef INDEXER_SOURCE_CONFIG_DIR
#define INDEXER_SOURCE_CONFIG_DIR "deploy/configs"
#endif

namespace indexer {

std::string DefaultConfigDir() {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string installed;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = (exe.parent_path() / INDEXER_CONFIG_DIR_FROM_BIN).lexically_normal();
    if (fs::is_directory(dir, ec)) return dir.string();
    installed = dir.string();
  }
  if (fs::is_directory(INDEXER_SOURCE_CONFIG_DIR, ec)) return INDEXER_SOURCE_CONFIG_DIR;
  return installed.empty() ? std::string(INDEXER_SOURCE_CONFIG_DIR) : installed;
}

}  // namespace indexer
