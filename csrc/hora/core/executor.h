#pragma once
// Runs the responses a cycle produced, in order, on this rank: fuses
// adjacent compatible allreduces into one batch, works out each
// collective's CollectivePlan, hands the bytes to the allreduce router, the
// communicator or the GPU executor, and completes each caller's Work.
#include <memory>
#include <vector>

#include "hora/algo/adasum.h"
#include "hora/algo/allreduce_router.h"
#include "hora/comm/communicator.h"
#include "hora/common/collective_watch.h"
#include "hora/common/owned_buffer.h"
#include "hora/core/collective_plan.h"
#include "hora/core/config.h"
#include "hora/core/gpu_executor.h"
#include "hora/core/message.h"
#include "hora/core/tensor_queue.h"
#include "hora/core/timeline.h"

namespace hora {

// The end of the fused batch that starts at responses[first]: the following
// allreduces that agree with it on device, dtype, op, scale factors and
// contributors, as long as their wire bytes stay within `threshold_bytes`
// (the first always runs, however large).
size_t FusedBatchEnd(const std::vector<Response>& responses, size_t first, int64_t threshold_bytes);

class Executor : private CollectivePath {
 public:
  Executor(Communicator* comm, TensorQueue* queue, const Config& config, Timeline* timeline)
      : comm_(comm),
        queue_(queue),
        config_(config),
        fusion_threshold_bytes_(config.fusion_threshold_bytes),
        timeline_(timeline) {}

  // Its engine was given up while this may still run a collective.
  void Abandon() { watch_.Abandon(); }

  // A transport failure is returned after failing the affected Works; the
  // engine then stops. `decided` is when the cycle's negotiation ended (the
  // timeline's QUEUE phase runs from there to each collective's start).
  // Add/remove-process-set responses are not run here: they come back in
  // `set_changes`, in order, with their Works, for the process-set table.
  struct SetChange {
    Response response;
    std::shared_ptr<Work> work;
  };
  Status Run(const std::vector<Response>& responses, Timeline::Clock::time_point decided,
             std::vector<SetChange>* set_changes);
  // The allreduce algorithms; set once before the first Run.
  void SetRouter(std::unique_ptr<AllreduceRouter> router) { router_ = std::move(router); }
  const AllreduceRouter* router() const { return router_.get(); }
  // Autotuning changes it between cycles (on every rank at once).
  void SetFusionThreshold(int64_t bytes) { fusion_threshold_bytes_ = bytes; }
  void SetHierarchical(bool allowed) { router_->SetHierarchical(allowed); }
  // Bytes allreduced since the last call (what autotuning scores).
  int64_t TakeAllreducedBytes() {
    const int64_t bytes = allreduced_bytes_;
    allreduced_bytes_ = 0;
    return bytes;
  }

 private:
  // The CPU path on host memory (also what a GPU executor that stages
  // through host memory runs on its copies).
  Status Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                   const std::vector<bool>& present, const CollectivePlan& plan) override;
  Status Run(const Response& response, TensorEntry& entry, const CollectivePlan& plan) override;
  // Runs batch[0..batch_size) as one fused allreduce.
  Status RunAllreduce(const Response* batch, size_t batch_size,
                      Timeline::Clock::time_point decided);
  // Timeline spans for one collective over `batch` (copy phases only when
  // their start and end differ).
  struct Phases {
    Timeline::Clock::time_point start, copied_in, reduced, copied_out;
  };
  void Record(const Response* batch, size_t batch_size, const std::string& kind,
              const std::string& collective, Timeline::Clock::time_point decided,
              const Phases& phases, int64_t bytes);
  Status RunOne(const Response& response, TensorEntry& entry);
  Status RunAllgather(TensorEntry& entry, const CollectivePlan& plan);
  Status RunBroadcast(const Response& response, TensorEntry& entry);
  Status RunAlltoall(TensorEntry& entry, const CollectivePlan& plan);
  Status RunReducescatter(const Response& response, TensorEntry& entry, const CollectivePlan& plan);
  // GPU tensors go to the GPU executor, made on first use.
  Status Gpu(const TensorEntry* entry, GpuExecutor** out);

  Communicator* comm_;
  TensorQueue* queue_;
  Config config_;
  std::unique_ptr<GpuExecutor> gpu_;
  int64_t fusion_threshold_bytes_;
  FusionBuffer fusion_buffer_;
  std::unique_ptr<AllreduceRouter> router_;
  AdasumAllreduce adasum_;
  std::vector<Piece> pieces_;
  Timeline* timeline_;
  int64_t allreduced_bytes_ = 0;
  CollectiveWatch watch_;  // the collective running now, for the heartbeat to name
  // Set by a collective that went through but failed this rank's own call
  // (an allgather output of the wrong size): the Work fails, the engine
  // goes on.
  Status local_error_;
};

}  // namespace hora
