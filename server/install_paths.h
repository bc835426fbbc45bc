// Where indexerd finds its profiles when neither --config-dir nor
// INDEXERD_CONFIG_DIR names a folder.
#pragma once

#include <string>

namespace indexer {

// The installed tree first: <prefix>/share/indexerd/configs, found from this
// executable's own path (so a relocated prefix works), then the source tree
// the binary was built from (build-tree runs). The first that exists; the
// installed path when neither does (the error then names it).
std::string DefaultConfigDir();

}  // namespace indexer
