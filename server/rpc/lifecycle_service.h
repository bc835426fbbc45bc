// The lifecycle methods of indexer.v1.Indexer (ListSequences,
// ExportEntries), served on raw bytes like the rest of the service
// (service.h); IndexerService forwards to these.
#pragma once

#include <string>

#include "grpcpp/grpcpp.h"
#include "server/core/engine.h"

namespace indexer {

class Executor;

// Page size of ListSequences: the default and the largest accepted.
inline constexpr uint32_t kListSequencesDefaultPage = 1000;
inline constexpr uint32_t kListSequencesMaxPage = 10000;

// The caller's sequences (namespace `client`, identity.h).
grpc::ServerUnaryReactor* ServeListSequences(Engine* engine, const std::string& client,
                                             grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* req,
                                             grpc::ByteBuffer* resp);

// Streams a sequence of namespace `client` as WriteEntriesRequest messages,
// each built (entries read from the pools) on `executor`, one at a time.
// REQUIRES: `engine` and `executor` outlive the call.
grpc::ServerWriteReactor<grpc::ByteBuffer>* ServeExportEntries(Engine* engine, Executor* executor,
                                                               const std::string& client,
                                                               grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* req);

}  // namespace indexer
