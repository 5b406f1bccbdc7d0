#include "hora/core/timeline.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "hora/common/logging.h"

namespace hora {
namespace {

std::string Quote(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// The engine's own row (cycle marks) comes first in the viewer.
const char* const kEngineRow = "(engine cycles)";

}  // namespace

Timeline::~Timeline() { Stop(); }

Status Timeline::Start(const std::string& path, bool mark_cycles, size_t queue_events) {
  std::lock_guard<std::mutex> control(control_);
  StopLocked();
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) {
    return Status::InvalidArgument("cannot write the timeline to '" + path +
                                   "': " + std::strerror(errno));
  }
  file_ = file;
  first_ = true;
  rows_.clear();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.clear();
    capacity_ = std::max<size_t>(1, queue_events);
    stopping_ = false;
    dropped_ = 0;
    drop_reported_ = false;
  }
  origin_ = Clock::now();
  WriteRaw("[\n");
  std::fflush(file_);
  mark_cycles_ = mark_cycles;
  writer_ = std::thread([this] { WriterLoop(); });
  active_ = true;
  return Status::OK();
}

void Timeline::Stop() {
  std::lock_guard<std::mutex> control(control_);
  StopLocked();
}

void Timeline::StopLocked() {
  if (!writer_.joinable()) return;
  active_ = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  writer_.join();
  WriteRaw("\n]\n");
  std::fclose(file_);
  file_ = nullptr;
}

int64_t Timeline::Micros(Clock::time_point t) const {
  const Timeline* base = target_ ? target_ : this;  // a view counts from its file's start
  return std::chrono::duration_cast<std::chrono::microseconds>(t - base->origin_).count();
}

void Timeline::Push(Event event) {
  if (target_) {
    event.row += row_suffix_;
    target_->Push(std::move(event));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (queue_.size() >= capacity_) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(event));
  }
  wake_.notify_one();
}

void Timeline::Begin(const std::string& tensor, const std::string& activity,
                     const std::string& args) {
  if (!active()) return;
  Push({'B', tensor, activity, Micros(Clock::now()), 0, args});
}

void Timeline::End(const std::string& tensor, const std::string& activity) {
  if (!active()) return;
  Push({'E', tensor, activity, Micros(Clock::now()), 0, ""});
}

void Timeline::Span(const std::string& tensor, const std::string& activity, Clock::time_point start,
                    Clock::time_point end, const std::string& args) {
  if (!active()) return;
  const int64_t begin = Micros(start);
  Push({'X', tensor, activity, begin, std::max<int64_t>(0, Micros(end) - begin), args});
}

void Timeline::Instant(const std::string& tensor, const std::string& what,
                       const std::string& args) {
  if (!active()) return;
  Push({'i', tensor, what, Micros(Clock::now()), 0, args});
}

void Timeline::Cycle(int64_t number, size_t responses) {
  if (!active() || !mark_cycles()) return;
  Push({'i', kEngineRow, "CYCLE", Micros(Clock::now()), 0,
        "{\"cycle\": " + std::to_string(number) + ", \"responses\": " + std::to_string(responses) +
            "}"});
}

void Timeline::WriterLoop() {
  std::vector<Event> batch;
  for (;;) {
    bool stop;
    uint64_t dropped = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait_for(lock, std::chrono::milliseconds(100),
                     [this] { return stopping_ || !queue_.empty(); });
      batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
      queue_.clear();
      stop = stopping_;
      if (dropped_ > 0 && !drop_reported_) {
        drop_reported_ = true;
        dropped = dropped_;
      }
    }
    for (const Event& event : batch) Write(event);
    batch.clear();
    if (dropped > 0) {
      HORA_LOG(kWarning) << "timeline: the writer fell behind and dropped " << dropped
                         << " event(s) (and will drop more, unreported, while it stays behind)";
      WriteRaw(std::string(first_ ? "" : ",\n") +
               "{\"name\": \"events dropped\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, "
               "\"tid\": 0, \"ts\": " +
               std::to_string(Micros(Clock::now())) + "}");
      first_ = false;
    }
    std::fflush(file_);
    if (stop) return;
  }
}

void Timeline::Write(const Event& event) {
  auto row = rows_.find(event.row);
  if (row == rows_.end()) {
    const int pid = static_cast<int>(rows_.size()) + 1;
    row = rows_.emplace(event.row, pid).first;
    WriteRaw(std::string(first_ ? "" : ",\n") +
             "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + std::to_string(pid) +
             ", \"args\": {\"name\": " + Quote(event.row) +
             "}},\n"
             "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " +
             std::to_string(pid) + ", \"args\": {\"sort_index\": " + std::to_string(pid) + "}}");
    first_ = false;
  }
  std::string json = std::string(first_ ? "" : ",\n") + "{\"name\": " + Quote(event.name) +
                     ", \"ph\": \"" + event.phase + "\", \"pid\": " + std::to_string(row->second) +
                     ", \"tid\": 0, \"ts\": " + std::to_string(event.ts_us);
  if (event.phase == 'X') json += ", \"dur\": " + std::to_string(event.dur_us);
  if (event.phase == 'i') json += ", \"s\": \"p\"";
  if (!event.args.empty()) json += ", \"args\": " + event.args;
  json += "}";
  first_ = false;
  WriteRaw(json);
}

void Timeline::WriteRaw(const std::string& json) {
  if (file_ != nullptr) std::fwrite(json.data(), 1, json.size(), file_);
}

}  // namespace hora
