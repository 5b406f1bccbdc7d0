#pragma once
// A Chrome-trace / Perfetto JSON file of what the engine does with every
// tensor: negotiation (with a mark as each rank becomes ready), waiting in
// the cycle's queue, copies into and out of the fusion buffer, and the
// collective itself, named by backend and algorithm; optionally a mark per
// cycle. Rank 0 writes it, as Horovod's timeline does (rank 0 is where all
// ranks' readiness is known).
//
// Recording costs the engine one atomic load per event while off, and a
// queue push while on: a writer thread formats and writes the events. If
// the writer falls behind, events are dropped (and that is logged once),
// never waited for. The file is a JSON array that is flushed as it grows,
// so a job killed mid-run still leaves a file Perfetto and chrome://tracing
// open (both accept a missing closing bracket).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "hora/common/status.h"

namespace hora {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  Timeline() = default;
  ~Timeline();
  // Makes this (unstarted) timeline a view that writes into `target`'s
  // file, with `row_suffix` added to every tensor's row (" [process set
  // 2]": one row per tensor and set).
  void ForwardTo(Timeline* target, std::string row_suffix) {
    target_ = target;
    row_suffix_ = std::move(row_suffix);
  }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts writing to `path` (replacing a timeline already being written);
  // at most `queue_events` events wait for the writer, more are dropped.
  Status Start(const std::string& path, bool mark_cycles, size_t queue_events);
  // Finishes the file (closing bracket) and stops the writer.
  void Stop();
  bool active() const {
    return target_ ? target_->active() : active_.load(std::memory_order_relaxed);
  }
  bool mark_cycles() const {
    return target_ ? target_->mark_cycles() : mark_cycles_.load(std::memory_order_relaxed);
  }

  // One row per tensor. `activity` spans nest: Begin/End pairs, or Span for
  // one whose start was noted earlier. `args` is a JSON object or "".
  void Begin(const std::string& tensor, const std::string& activity, const std::string& args = "");
  void End(const std::string& tensor, const std::string& activity);
  void Span(const std::string& tensor, const std::string& activity, Clock::time_point start,
            Clock::time_point end, const std::string& args = "");
  void Instant(const std::string& tensor, const std::string& what, const std::string& args = "");
  // A mark on the engine's own row, when cycles are being marked.
  void Cycle(int64_t number, size_t responses);

 private:
  struct Event {
    char phase;  // 'B', 'E', 'X', 'i'
    std::string row;
    std::string name;
    int64_t ts_us;
    int64_t dur_us;
    std::string args;
  };
  void StopLocked();  // with control_ held
  void Push(Event event);
  int64_t Micros(Clock::time_point t) const;
  void WriterLoop();
  void Write(const Event& event);
  void WriteRaw(const std::string& json);

  Timeline* target_ = nullptr;  // a view: events go there
  std::string row_suffix_;
  std::atomic<bool> active_{false};
  std::atomic<bool> mark_cycles_{false};
  Clock::time_point origin_;

  std::mutex mutex_;  // guards queue_, stopping_, dropped_
  std::condition_variable wake_;
  std::deque<Event> queue_;
  size_t capacity_ = 1 << 16;
  bool stopping_ = false;
  uint64_t dropped_ = 0;
  bool drop_reported_ = false;

  std::mutex control_;  // serializes Start/Stop
  std::thread writer_;
  // Writer thread only:
  std::FILE* file_ = nullptr;
  bool first_ = true;
  std::unordered_map<std::string, int> rows_;
};

}  // namespace hora
