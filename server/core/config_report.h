// What `indexerd --check-config` prints: a validated model's resolved
// geometry (layer groups, pages, bytes per page / per layer / per group and
// in all), so an operator can size a profile without starting the daemon.
#pragma once

#include <string>

#include "server/core/model.h"

namespace indexer {

// Human-readable, one line per group plus a header and a total line.
std::string DescribeGeometry(const Model& model);

}  // namespace indexer
