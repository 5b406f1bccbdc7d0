#include "hora/core/tensor_queue.h"

namespace hora {
namespace {

Status InFlight(const std::string& name) {
  return Status::InvalidArgument(
      "a collective named '" + name +
      "' is already in flight on this rank; wait for it to finish or use another name");
}

}  // namespace

void TensorQueue::NoteLocked(const std::string& name, RequestNote note) {
  Request request;
  request.name = name;
  request.note = note;
  new_requests_.push_back(std::move(request));
  has_new_.store(true, std::memory_order_release);
}

void TensorQueue::RefusedLocked(const std::string& name) {
  NoteLocked(name, RequestNote::kRefusedAgain);
  refused_again_.insert(name);
}

void TensorQueue::CallingLocked(const std::string& name) {
  if (!refused_again_.empty() && refused_again_.erase(name) != 0) {
    NoteLocked(name, RequestNote::kCalledAgain);
  }
}

Status TensorQueue::Add(std::vector<TensorEntry> entries) {
  // The requests move to the engine (the entries keep only what running the
  // collective needs) and the map keys are copied before taking the lock, so
  // a caller submitting a burst holds it only briefly.
  std::vector<Request> requests;
  requests.reserve(entries.size());
  std::unordered_set<std::string> names;
  for (TensorEntry& e : entries) {
    if (e.work) e.work->SetActivity(activity_);
    requests.push_back(std::move(e.request));
    const std::string& name = requests.back().name;
    if (entries.size() > 1 && !names.insert(name).second) return InFlight(name);
  }
  bool first_new = false;
  std::string in_flight;  // a name refused for being in flight here
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return closed_status_;
    for (const Request& r : requests) {
      if (entries_.count(r.name) != 0) {
        in_flight = r.name;
        break;
      }
    }
    first_new = new_requests_.empty();
    if (!in_flight.empty()) {
      RefusedLocked(in_flight);
    } else {
      for (size_t i = 0; i < entries.size(); ++i) {
        entries_.emplace(requests[i].name, std::move(entries[i]));
      }
      for (const Request& r : requests) CallingLocked(r.name);
      if (new_requests_.empty()) {
        new_requests_.swap(requests);
      } else {
        for (Request& r : requests) new_requests_.push_back(std::move(r));
      }
    }
    has_new_.store(!new_requests_.empty(), std::memory_order_release);
    in_flight_.store(entries_.size(), std::memory_order_release);
  }
  // Only the first request since the engine last took them needs to wake
  // it: until it takes them it will find the later ones too. A burst of
  // submissions (a backward pass) then costs one wake-up, not one system
  // call and engine wake-up per tensor.
  if (first_new) on_new_work_();
  return in_flight.empty() ? Status::OK() : InFlight(in_flight);
}

Status TensorQueue::AddOne(TensorEntry entry) {
  // The request moves to the engine; the entry keeps only what running the
  // collective needs. The map key is made outside the lock.
  if (entry.work) entry.work->SetActivity(activity_);
  Request request = std::move(entry.request);
  std::string key = request.name;
  bool first_new = false;
  bool refused = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return closed_status_;
    first_new = new_requests_.empty();
    auto inserted = entries_.emplace(std::move(key), std::move(entry));
    refused = !inserted.second;
    if (refused) {
      RefusedLocked(request.name);
    } else {
      CallingLocked(request.name);
      new_requests_.push_back(std::move(request));
    }
    has_new_.store(true, std::memory_order_release);
    in_flight_.store(entries_.size(), std::memory_order_release);
  }
  if (first_new) on_new_work_();
  return refused ? InFlight(request.name) : Status::OK();
}

void TensorQueue::TakeNewRequests(std::vector<Request>* out) {
  out->clear();
  if (!has_new_.load(std::memory_order_acquire)) return;  // an Add racing this one wakes us
  // The next burst lands in a vector with room for one like the largest so
  // far (up to kMaxBurstCapacity), allocated here rather than under the
  // lock or one reallocation (moving every request) at a time while the
  // caller submits.
  std::vector<Request> spare;
  spare.reserve(burst_capacity_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out->swap(new_requests_);
    new_requests_.swap(spare);
    has_new_.store(false, std::memory_order_release);
  }
  burst_capacity_ = std::min<size_t>(std::max(burst_capacity_, out->size()), kMaxBurstCapacity);
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
    refused_again_.clear();
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
