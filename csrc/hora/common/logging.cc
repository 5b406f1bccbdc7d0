#include "hora/common/logging.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace hora {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarning)};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_time{true};

const char* LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "TRACE";
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
    case LogLevel::kOff: return "OFF";
  }
  return "?";
}
}  // namespace

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogRank(int rank) { g_rank = rank; }
void SetLogTime(bool shown) { g_time = shown; }

bool ParseLogLevel(const std::string& text, LogLevel* level) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  static const struct {
    const char* name;
    LogLevel level;
  } kNames[] = {{"trace", LogLevel::kTrace},  {"debug", LogLevel::kDebug},
                {"info", LogLevel::kInfo},    {"warning", LogLevel::kWarning},
                {"warn", LogLevel::kWarning}, {"error", LogLevel::kError},
                {"fatal", LogLevel::kError},  {"off", LogLevel::kOff}};
  for (const auto& entry : kNames) {
    if (lower == entry.name) {
      *level = entry.level;
      return true;
    }
  }
  return false;
}

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = file;
  for (const char* p = file; *p; ++p) {
    if (*p == '/') base = p + 1;
  }
  const int rank = g_rank.load();
  stream_ << "[hora";
  if (rank >= 0) stream_ << " rank " << rank;
  stream_ << "] ";
  if (g_time.load()) {
    const auto now = std::chrono::system_clock::now();
    const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
    const auto micros =
        std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
        1000000;
    std::tm local{};
    localtime_r(&seconds, &local);
    char when[40];
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &local);
    char fraction[8];
    std::snprintf(fraction, sizeof(fraction), ".%06lld", static_cast<long long>(micros));
    stream_ << when << fraction << " ";
  }
  stream_ << LevelName(level_) << " " << base << ":" << line << ": ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  const std::string text = stream_.str();
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace hora
