// Prints the profile of the daemon at argv[1] through the installed client.
#include <cstdio>

#include "indexer/client.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto c = indexer::client::IndexerClient::Connect(argv[1]);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  auto info = (*c)->GetServerInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "%s\n", info.status().ToString().c_str());
    return 1;
  }
  std::printf("profile %s, %d layers\n", info->profile().c_str(), info->layers_size());
  return 0;
}
