#include "server/rpc/log_format.h"

#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/spdlog.h"

namespace indexer {
namespace {

std::atomic<LogFormat> g_format{LogFormat::kText};
thread_local std::vector<std::pair<std::string, std::string>> t_fields;

constexpr char kTextPattern[] = "%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v";

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto t = msg.time;
    const std::time_t secs = std::chrono::system_clock::to_time_t(t);
    const int64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           t.time_since_epoch()).count() % 1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    const auto level = spdlog::level::to_string_view(msg.level);
    std::string line = absl::StrFormat(
        "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",\"level\":\"%s\",\"msg\":\"%s\"",
        tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
        static_cast<int>(ms), std::string(level.data(), level.size()),
        JsonEscape(std::string(msg.payload.data(), msg.payload.size())));
    for (const auto& [k, v] : t_fields) {
      absl::StrAppend(&line, ",\"", JsonEscape(k), "\":\"", JsonEscape(v), "\"");
    }
    line += "}\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonFormatter>();
  }
};

}  // namespace

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

absl::Status SetLogFormat(const std::string& format) {
  if (format == "text") {
    spdlog::set_pattern(kTextPattern);
    g_format = LogFormat::kText;
  } else if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
    g_format = LogFormat::kJson;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format: expected text or json, got \"", format, "\""));
  }
  return absl::OkStatus();
}

LogFormat CurrentLogFormat() { return g_format.load(std::memory_order_relaxed); }

LogFields::LogFields(std::vector<std::pair<std::string, std::string>> fields)
    : added_(fields.size()) {
  for (auto& f : fields) t_fields.push_back(std::move(f));
}

LogFields::~LogFields() { t_fields.resize(t_fields.size() - added_); }

}  // namespace indexer
