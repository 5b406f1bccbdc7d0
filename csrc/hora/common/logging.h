#pragma once
// Minimal leveled logging to stderr. Every line carries the rank, because
// with several ranks writing to one terminal a line without it is useless,
// and the time (to the microsecond, as Horovod's) unless hidden.
#include <sstream>
#include <string>

namespace hora {

enum class LogLevel { kTrace = 0, kDebug = 1, kInfo = 2, kWarning = 3, kError = 4, kOff = 5 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void SetLogRank(int rank);
void SetLogTime(bool shown);
bool ParseLogLevel(const std::string& text, LogLevel* level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace hora

#define HORA_LOG(level)                                  \
  if (::hora::LogLevel::level < ::hora::GetLogLevel()) { \
  } else                                                 \
    ::hora::LogMessage(::hora::LogLevel::level, __FILE__, __LINE__).stream()
