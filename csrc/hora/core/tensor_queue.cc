#include "hora/core/tensor_queue.h"

#include <unordered_set>

namespace hora {
namespace {

Status InFlight(const std::string& name) {
  return Status::InvalidArgument(
      "a collective named '" + name +
      "' is already in flight on this rank; wait for it to finish or use another name");
}

}  // namespace

Status TensorQueue::Add(std::vector<TensorEntry> entries) {
  // The copies the engine negotiates with, and the map keys, are made before
  // taking the lock, so a caller submitting a burst holds it only briefly
  // while the engine takes entries out.
  std::vector<Request> requests;
  requests.reserve(entries.size());
  std::unordered_set<std::string> names;
  for (const TensorEntry& e : entries) {
    requests.push_back(e.request);
    if (entries.size() > 1 && !names.insert(e.request.name).second) return InFlight(e.request.name);
  }
  bool first_new = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return closed_status_;
    for (const Request& r : requests) {
      if (entries_.count(r.name) != 0) return InFlight(r.name);
    }
    first_new = new_requests_.empty();
    for (size_t i = 0; i < entries.size(); ++i) {
      entries_.emplace(requests[i].name, std::move(entries[i]));
    }
    if (new_requests_.empty()) {
      new_requests_.swap(requests);
    } else {
      for (Request& r : requests) new_requests_.push_back(std::move(r));
    }
    has_new_.store(!new_requests_.empty(), std::memory_order_release);
    in_flight_.store(entries_.size(), std::memory_order_release);
  }
  // Only the first request since the engine last took them needs to wake
  // it: until it takes them it will find the later ones too. A burst of
  // submissions (a backward pass) then costs one wake-up, not one system
  // call and engine wake-up per tensor.
  if (first_new) on_new_work_();
  return Status::OK();
}

Status TensorQueue::AddOne(TensorEntry entry) {
  Request request = entry.request;  // copied outside the lock
  bool first_new = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return closed_status_;
    auto inserted = entries_.emplace(request.name, std::move(entry));
    if (!inserted.second) return InFlight(request.name);
    first_new = new_requests_.empty();
    new_requests_.push_back(std::move(request));
    has_new_.store(true, std::memory_order_release);
    in_flight_.store(entries_.size(), std::memory_order_release);
  }
  if (first_new) on_new_work_();
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

void TensorQueue::TakeEntries(const Response* batch, size_t count, TensorEntry* out,
                              std::vector<bool>* present) {
  present->assign(count, false);
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t k = 0; k < count; ++k) {
    auto it = entries_.find(batch[k].name);
    if (it == entries_.end()) continue;
    out[k] = std::move(it->second);
    entries_.erase(it);
    (*present)[k] = true;
  }
  in_flight_.store(entries_.size(), std::memory_order_release);
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
