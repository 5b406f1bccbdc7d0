#pragma once
// How the engine waits for a peer that has not arrived yet: spin briefly
// (the peer is usually microseconds away), then sleep in growing steps. A
// rank's engine thread shares its core with the framework's compute, so a
// wait that spins for as long as the peer is late steals exactly the CPU
// the late peer's own rank would need to catch up.
#include <time.h>

#include <chrono>
#include <cstdint>

namespace hora {

// Set by each engine thread for its own waits before each cycle: true
// while a caller is blocked on one of that engine's results, when spinning
// steals nothing from anyone (and blocking MPI calls are the fastest way to
// wait). Per thread, so that one process set's busy callers never make
// another set's engine spin.
inline bool& SpinWhileWaiting() {
  thread_local bool spin = false;
  return spin;
}

class Backoff {
 public:
  // Call once per unsuccessful check.
  void Pause() {
    if (spins_ < kSpinChecks || SpinWhileWaiting()) {
      ++spins_;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      return;
    }
    if (spins_ == kSpinChecks) {
      ++spins_;
      spin_end_ = std::chrono::steady_clock::now();
    }
    // Keep spinning for kSpinMicros of wall time, then sleep, doubling the
    // nap from 2 us up to kMaxSleepMicros.
    if (sleep_us_ == 0) {
      if (std::chrono::steady_clock::now() - spin_end_ < std::chrono::microseconds(kSpinMicros)) {
        return;
      }
      sleep_us_ = 2;
    }
    const timespec nap{0, static_cast<long>(sleep_us_) * 1000};
    nanosleep(&nap, nullptr);
    if (sleep_us_ < kMaxSleepMicros) sleep_us_ *= 2;
  }

  // Whether the wait has gone on long enough to check on the peer's health.
  bool Sleeping() const { return sleep_us_ > 0; }

  static constexpr int kSpinChecks = 256;
  static constexpr int kSpinMicros = 30;
  static constexpr int kMaxSleepMicros = 64;

 private:
  int spins_ = 0;
  int sleep_us_ = 0;
  std::chrono::steady_clock::time_point spin_end_;
};

}  // namespace hora
