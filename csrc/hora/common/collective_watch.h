#pragma once
// What each engine thread is running, and since when, so that a collective
// that never ends is named.
//
// A transport can wait inside a collective for data that never comes: a
// network path that drops one connection's packets, a transport library
// that stalls. Every process then still answers the heartbeat, and the
// stall inspector, which looks between collectives, sees nothing: the job
// would hang without a word. Each executor therefore marks the collective
// it runs (a mutex and a clock read per collective, nothing formatted), and
// the heartbeat thread asks Overdue() on each beat.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace hora {

class CollectiveWatch {
 public:
  using Clock = std::chrono::steady_clock;

  CollectiveWatch();  // registered for Overdue() until destroyed
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

  // `kind` (a literal) and `name` stay valid until End(); `more`: further
  // tensors fused with it.
  void Begin(const char* kind, const std::string* name, size_t more, int64_t bytes);
  // A collective that was reported as overdue is reported again as ended.
  void End();
  // The engine was given up with its thread still in a collective (a rank
  // was lost and the world re-formed without it): that collective is no
  // transport fault, so it is reported neither as overdue nor as ended.
  void Abandon();

  // One warning for each collective that has run for `after` or longer and
  // was not reported yet.
  static std::vector<std::string> Overdue(Clock::time_point now, Clock::duration after);

 private:
  std::string DescribeLocked() const;

  std::mutex mutex_;
  bool running_ = false;
  bool reported_ = false;
  bool abandoned_ = false;
  Clock::time_point since_{};
  const char* kind_ = "";
  const std::string* name_ = nullptr;
  size_t more_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace hora
