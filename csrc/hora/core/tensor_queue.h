#pragma once
// The hand-off between caller threads and the engine thread. Callers add
// entries (a request plus the memory it reads and writes); the engine takes
// the new requests for negotiation and later takes each entry by name when
// its response says to run it.
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "hora/algo/pieces.h"
#include "hora/common/status.h"
#include "hora/core/message.h"
#include "hora/core/tensor.h"
#include "hora/core/work.h"

namespace hora {

struct TensorEntry {
  // Moved to the engine's negotiation when the entry is queued.
  Request request;
  TensorView input;
  // allreduce / broadcast destination (may equal input.data); an
  // allgather's caller-given destination of `output_bytes`
  void* output = nullptr;
  int64_t output_bytes = 0;
  // A packed allreduce on the host (request.members set): each member's
  // input and output memory, in the members' order; `input` then only
  // gives the dtype and the total count, and `output` is unused.
  std::vector<Piece> members;
  std::shared_ptr<Work> work;
  // GPU tensors: the caller's CUDA stream, and an event recorded on it at
  // submission (the engine's kernels start after it; its owner returns it to
  // the pool).
  uintptr_t stream = 0;
  std::shared_ptr<void> ready;
};

class TensorQueue {
 public:
  explicit TensorQueue(std::function<void()> on_new_work)
      : on_new_work_(std::move(on_new_work)), activity_(std::make_shared<WaitActivity>()) {}

  // The waiters of this queue's Works (every Work added gets it).
  WaitActivity& activity() const { return *activity_; }
  const std::shared_ptr<WaitActivity>& shared_activity() const { return activity_; }

  // Adds all entries or none (a group must not be half-submitted). Fails
  // with InvalidArgument if a name is already in flight or repeated. Calls
  // on_new_work only when these are the first new requests since the last
  // TakeNewRequests. A name refused for being in flight is noted for rank
  // 0 (RequestNote::kRefusedAgain), and so is its next call here
  // (kCalledAgain): ranks that meanwhile call it again and wait for this
  // one then fail with the reason instead of stalling.
  Status Add(std::vector<TensorEntry> entries);
  // The same for one entry, without the vectors (the per-gradient path).
  Status AddOne(TensorEntry entry);
  void TakeNewRequests(std::vector<Request>* out);
  // Lock-free: the engine asks on every pass of its loop, and taking the
  // mutex there would fight the caller threads adding work.
  bool HasNewRequests() const { return has_new_.load(std::memory_order_acquire); }
  // Collectives submitted on this rank and not completed yet.
  bool HasInFlight() const { return in_flight_.load(std::memory_order_acquire) > 0; }
  // Removes and returns the entry; false if this rank never submitted it
  // (a rank that has joined runs allreduces it did not submit).
  bool TakeEntry(const std::string& name, TensorEntry* out);
  // TakeEntry for every response of a fused batch under one lock;
  // (*present)[k] says whether batch[k] was submitted here.
  void TakeEntries(const Response* batch, size_t count, TensorEntry* out,
                   std::vector<bool>* present);
  // Fails every entry still in flight, e.g. when the engine stops.
  void FailAll(const Status& status);
  // Refuses further Add calls with this status.
  void Close(const Status& status);

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, TensorEntry> entries_;
  std::vector<Request> new_requests_;
  std::atomic<bool> has_new_{false};  // !new_requests_.empty(), written under mutex_
  std::atomic<size_t> in_flight_{0};  // entries_.size(), written under mutex_
  std::function<void()> on_new_work_;
  std::shared_ptr<WaitActivity> activity_;
  // Queues a note about `name` for rank 0 (under mutex_).
  void NoteLocked(const std::string& name, RequestNote note);
  // `name` was refused for being in flight: noted, and remembered.
  void RefusedLocked(const std::string& name);
  // `name` is called: noted if it was refused since its last call.
  void CallingLocked(const std::string& name);
  // Names refused here for being in flight and not called again since
  // (under mutex_).
  std::unordered_set<std::string> refused_again_;
  bool closed_ = false;
  Status closed_status_;
  // Engine thread only: the room TakeNewRequests leaves for the next burst.
  size_t burst_capacity_ = 16;
  static constexpr size_t kMaxBurstCapacity = 1024;  // ~200 KB of requests
};

}  // namespace hora
