#include "hora/core/work.h"

#include <sched.h>

#include <atomic>

#include "hora/common/backoff.h"

namespace hora {
namespace {
std::atomic<int> g_waiters{0};
}  // namespace

int Work::Waiters() { return g_waiters.load(std::memory_order_relaxed); }

void Work::Complete(const Status& status) {
  MarkDone(status);
  Notify();
}

void Work::MarkDone(const Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_) return;
  status_ = status;
  done_ = true;
}

void Work::Notify() { done_cv_.notify_all(); }

Status Work::Wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_) {
    g_waiters.fetch_add(1, std::memory_order_relaxed);
    done_cv_.wait(lock, [this] { return done_; });
    g_waiters.fetch_sub(1, std::memory_order_relaxed);
  }
  return status_;
}

bool Work::WaitFor(std::chrono::milliseconds timeout, Status* status) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_) {
    g_waiters.fetch_add(1, std::memory_order_relaxed);
    done_cv_.wait_for(lock, timeout, [this] { return done_; });
    g_waiters.fetch_sub(1, std::memory_order_relaxed);
    if (!done_) return false;
  }
  *status = status_;
  return true;
}

bool Work::YieldUntilDone(std::chrono::microseconds limit) {
  if (!SpinWhileWaiting().load(std::memory_order_relaxed)) return Poll();
  g_waiters.fetch_add(1, std::memory_order_relaxed);
  const auto end = std::chrono::steady_clock::now() + limit;
  bool done = Poll();
  while (!done && std::chrono::steady_clock::now() < end) {
    sched_yield();
    done = Poll();
  }
  g_waiters.fetch_sub(1, std::memory_order_relaxed);
  return done;
}

bool Work::Poll() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

}  // namespace hora
