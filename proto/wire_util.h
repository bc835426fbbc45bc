// Pieces of protobuf's wire format for the messages whose large bytes go to
// gRPC as slices of their own (server/rpc/reply_wire, client/request_wire):
// the varints come from protobuf's own coder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "google/protobuf/io/coded_stream.h"

namespace indexer::wire {

inline void AppendVarint(std::string* out, uint64_t v) {
  uint8_t buf[10];
  const uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(v, buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(end - buf));
}

inline size_t VarintSize(uint64_t v) {
  return google::protobuf::io::CodedOutputStream::VarintSize64(v);
}

// One-byte tag of a length-delimited field (wire type 2). REQUIRES: 1 <= field <= 15.
inline char LenTag(int field) { return static_cast<char>((field << 3) | 2); }

}  // namespace indexer::wire
