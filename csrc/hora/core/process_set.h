#pragma once
// Process sets: subsets of the job's ranks that run collectives among
// themselves (hybrid and model parallelism). Every rank knows every set's
// id and ranks; a rank that belongs to a set also holds the set's own
// negotiation state: a communicator made for the set, a queue, a
// controller (response cache, coordinator, stall inspector on the set's
// first rank) and an executor (fusion, the allreduce router with its
// shared-memory and ring paths). Set 0, the global set, is the engine's
// own state and is not a ProcessSet object.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/core/config.h"
#include "hora/core/controller.h"
#include "hora/core/executor.h"
#include "hora/core/tensor_queue.h"
#include "hora/core/timeline.h"

namespace hora {

// "process set 2 (ranks 0, 1)": how errors and logs name a set.
std::string DescribeProcessSet(int32_t id, const std::vector<int>& ranks);

// Why a list of ranks cannot form a set of a job of `size` ranks (empty,
// repeated or out-of-range ranks), or an empty string.
std::string InvalidProcessSetRanks(const std::vector<int>& ranks, int size);

class ProcessSet {
 public:
  // `comm` is the set's communicator (this rank is a member); `timeline` is
  // the job's (written on global rank 0).
  ProcessSet(int32_t id, std::vector<int> ranks, std::unique_ptr<Communicator> comm,
             const Config& config, Timeline* timeline, std::function<void()> on_new_work);

  int32_t id() const { return id_; }
  const std::vector<int>& ranks() const { return ranks_; }
  Communicator* comm() { return comm_.get(); }
  TensorQueue& queue() { return queue_; }
  Controller& controller() { return controller_; }
  Executor& executor() { return executor_; }
  // Collective over the set: picks the allreduce algorithms for its ranks.
  Status StartRouter(const AllreduceSettings& settings);
  // Whether this rank has something for the set's next cycle: new or
  // unsent requests, or (on the set's first rank) a stall check due.
  bool HasWork() const;

 private:
  const int32_t id_;
  const std::vector<int> ranks_;  // global ranks, ascending; set rank k is ranks_[k]
  std::unique_ptr<Communicator> comm_;
  // The job's timeline, each of this set's tensors on a row of its own
  // ("grad.3 [process set 2]"); written where the job's timeline is (rank 0).
  Timeline timeline_;
  TensorQueue queue_;
  Controller controller_;
  Executor executor_;
};

}  // namespace hora
