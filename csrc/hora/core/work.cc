#include "hora/core/work.h"

namespace hora {

void Work::Complete(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    status_ = status;
    done_ = true;
  }
  done_cv_.notify_all();
}

Status Work::Wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return done_; });
  return status_;
}

bool Work::Poll() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

}  // namespace hora
