#include "hora/core/tensor_queue.h"

#include <unordered_set>

namespace hora {

Status TensorQueue::Add(std::vector<TensorEntry> entries) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return closed_status_;
    std::unordered_set<std::string> seen;  // only for several entries at once
    for (const TensorEntry& e : entries) {
      const std::string& name = e.request.name;
      if (entries_.count(name) != 0 || (entries.size() > 1 && !seen.insert(name).second)) {
        return Status::InvalidArgument(
            "a collective named '" + name +
            "' is already in flight on this rank; wait for it to finish or use another name");
      }
    }
    for (TensorEntry& e : entries) {
      new_requests_.push_back(e.request);
      std::string name = e.request.name;
      entries_.emplace(std::move(name), std::move(e));
    }
    has_new_.store(!new_requests_.empty(), std::memory_order_release);
    in_flight_.store(entries_.size(), std::memory_order_release);
  }
  on_new_work_();
  return Status::OK();
}

void TensorQueue::TakeNewRequests(std::vector<Request>* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  out->swap(new_requests_);
  new_requests_.clear();
  has_new_.store(false, std::memory_order_release);
}

bool TensorQueue::TakeEntry(const std::string& name, TensorEntry* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return false;
  *out = std::move(it->second);
  entries_.erase(it);
  in_flight_.store(entries_.size(), std::memory_order_release);
  return true;
}

void TensorQueue::FailAll(const Status& status) {
  std::unordered_map<std::string, TensorEntry> failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failed.swap(entries_);
    new_requests_.clear();
    has_new_.store(false, std::memory_order_release);
    in_flight_.store(0, std::memory_order_release);
  }
  for (auto& item : failed) item.second.work->Complete(status);
}

void TensorQueue::Close(const Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  closed_status_ = status;
}

}  // namespace hora
