#pragma once
// A Work is the caller's handle on one submitted collective. The engine
// completes it exactly once, with OK or the Status that explains the
// failure; Wait() gives that Status back on the caller's thread.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "hora/common/status.h"
#include "hora/core/tensor.h"

namespace hora {

// Who is blocked on one engine's collectives, and whether that engine is
// cycling back to back. Each engine (the job's, and one per process set)
// has its own, shared with the Works of its queue: a caller waiting on one
// set keeps only that set's engine hot, never another set's.
// Each field on a cache line of its own, away from the shared_ptr counts
// that every submission changes: the engine writes `spinning` every cycle
// and callers change `waiters` as they wait, on other cores.
struct WaitActivity {
  alignas(64) std::atomic<int> waiters{0};
  alignas(64) std::atomic<bool> spinning{false};
};

class Work {
 public:
  void Complete(const Status& status);
  // Complete in two steps, for a batch: mark every Work done first, then
  // wake the waiters. A caller waiting on the batch's first Work then finds
  // the others done, instead of sleeping and being woken once per Work
  // (two context switches each on a core shared with the engine).
  void MarkDone(const Status& status);
  void Notify();
  // Blocks until completion. Never call with the Python GIL held unless
  // Poll() has returned true (then it returns at once).
  Status Wait();
  // Waits at most `timeout`; true (and the Status in `status`) once done.
  // Lets a caller that holds the GIL between slices run Python's signal
  // handlers while it waits.
  bool WaitFor(std::chrono::milliseconds timeout, Status* status);
  bool Poll() const;
  // Yields the core until done, for at most `limit`; true once done. While
  // the engine is cycling back to back (WaitActivity::spinning), a result is
  // microseconds away and usually computed on this very core: yielding
  // hands the core to the engine and takes it back without the futex wait
  // and wake of Wait(), two system calls on the round trip. Returns false
  // at once when the engine is not cycling. Counts as a waiter meanwhile.
  bool YieldUntilDone(std::chrono::microseconds limit);
  // The engine this Work was queued on counts its waiters here (set by the
  // queue before the caller sees the Work); a Work never queued has none.
  void SetActivity(std::shared_ptr<WaitActivity> activity) { activity_ = std::move(activity); }

  // Outputs the engine fills in before Complete() for collectives whose
  // output size is decided by negotiation.
  std::shared_ptr<OwnedBuffer> output;
  std::shared_ptr<DeviceBuffer> device_output;  // instead of `output` for GPU tensors
  std::vector<int64_t> output_shape;
  std::vector<int64_t> received_splits;
  int join_last_rank = -1;
  int32_t process_set_id = -1;  // add_process_set: the new set's id

 private:
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  Status status_;
  std::shared_ptr<WaitActivity> activity_;
};

}  // namespace hora
