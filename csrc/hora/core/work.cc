#include "hora/core/work.h"

#include <sched.h>

namespace hora {
namespace {

// Counts the calling thread as a waiter of the Work's engine while alive.
class Waiting {
 public:
  explicit Waiting(WaitActivity* activity) : activity_(activity) {
    if (activity_) activity_->waiters.fetch_add(1, std::memory_order_relaxed);
  }
  ~Waiting() {
    if (activity_) activity_->waiters.fetch_sub(1, std::memory_order_relaxed);
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  WaitActivity* activity_;
};

}  // namespace

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
    Waiting waiting(activity_.get());
    done_cv_.wait(lock, [this] { return done_; });
  }
  return status_;
}

bool Work::WaitFor(std::chrono::milliseconds timeout, Status* status) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!done_) {
    {
      Waiting waiting(activity_.get());
      done_cv_.wait_for(lock, timeout, [this] { return done_; });
    }
    if (!done_) return false;
  }
  *status = status_;
  return true;
}

bool Work::YieldUntilDone(std::chrono::microseconds limit) {
  if (!activity_ || !activity_->spinning.load(std::memory_order_relaxed)) return Poll();
  Waiting waiting(activity_.get());
  const auto end = std::chrono::steady_clock::now() + limit;
  bool done = Poll();
  while (!done && std::chrono::steady_clock::now() < end) {
    sched_yield();
    done = Poll();
  }
  return done;
}

bool Work::Poll() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

}  // namespace hora
