// The daemon's log line format: text (the default) or JSON lines
// (`indexerd --log-format json`): one object per line with "time" (UTC,
// RFC 3339), "level", "msg" and any fields the logging call attached with
// LogFields (request id, traceparent, method ...), all strings JSON-escaped.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace indexer {

enum class LogFormat { kText, kJson };

// Applies `format` to spdlog's default logger. INVALID_ARGUMENT naming
// --log-format for anything but "text" and "json".
absl::Status SetLogFormat(const std::string& format);
LogFormat CurrentLogFormat();

// Fields for the log calls this thread makes while the object lives (the
// default logger formats synchronously, on the calling thread). Nested
// scopes add to the outer ones. In text format the fields are ignored: the
// caller writes them into its message.
class LogFields {
 public:
  explicit LogFields(std::vector<std::pair<std::string, std::string>> fields);
  ~LogFields();
  LogFields(const LogFields&) = delete;
  LogFields& operator=(const LogFields&) = delete;

 private:
  size_t added_;
};

// `s` as the inside of a JSON string (quotes, backslashes, control
// characters escaped; bytes >= 0x80 passed through).
std::string JsonEscape(const std::string& s);

}  // namespace indexer
