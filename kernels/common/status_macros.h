// Status propagation helpers. The local Abseil (20220623) ships none.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define INDEXER_CONCAT_INNER_(a, b) a##b
#define INDEXER_CONCAT_(a, b) INDEXER_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status _indexer_status = (expr);     \
    if (!_indexer_status.ok()) return _indexer_status; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  ASSIGN_OR_RETURN_IMPL_(INDEXER_CONCAT_(_indexer_statusor_, __LINE__), lhs, rexpr)

#define ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                           \
  if (!tmp.ok()) return tmp.status();           \
  lhs = std::move(tmp).value()
