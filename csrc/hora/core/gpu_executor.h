#pragma once
// What the executor hands collectives on GPU tensors to, in types that
// compile without CUDA. A CUDA build implements it over NCCL
// (gpu_executor_nccl.cc), or, when ranks of one host share a GPU (which
// NCCL refuses), over host copies (gpu_executor_staged.cc); a CPU-only
// build links gpu_executor_none.cc, whose factory reports that GPU support
// was not compiled in.
#include <memory>
#include <string>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/core/collective_plan.h"
#include "hora/core/message.h"
#include "hora/core/shared_gpu.h"
#include "hora/core/tensor_queue.h"

namespace hora {

// One way of running negotiated collectives on this rank's entries. Every
// call is made on the engine thread, in the same order on every rank.
class CollectivePath {
 public:
  virtual ~CollectivePath() = default;
  // batch[k] runs on entries[k] where present[k]; an absent entry is a
  // rank that has joined and contributes neutral values. `plan` is the
  // batch head's (the fused responses share dtype, op and scale factors).
  virtual Status Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                           const std::vector<bool>& present, const CollectivePlan& plan) = 0;
  // Allgather, broadcast, alltoall or reducescatter of one tensor.
  virtual Status Run(const Response& response, TensorEntry& entry, const CollectivePlan& plan) = 0;
};

// A call queues its work on the executor's stream after each entry's ready
// event, and before returning makes each caller's stream wait for that
// work: the Works can then be completed at once, and the caller's next
// kernels see the results. Nothing here synchronizes the device.
class GpuExecutor : public CollectivePath {
 public:
  virtual std::string Describe() const = 0;
};

struct GpuOptions {
  // Allreduce inside each host on the GPU and across hosts through
  // `comm->cross()` (needs the same number of ranks on every host).
  bool hierarchical = false;
  // Ranks of one host on the same GPU: whether the job's GPU collectives
  // run on host copies through `host` or fail, naming the ranks.
  SharedGpuPolicy shared_gpu = SharedGpuPolicy::kAuto;
};

// Collective over `comm`: sets up the GPU path on `device` (-1: the default
// device of a rank that has joined) after every rank has told the others
// which GPU it holds. Made when the first GPU collective runs, which is the
// same response on every rank; a failure on any rank fails it on all, and
// every rank picks the same path. `host` (the CPU path of the same
// communicator) must outlive the executor.
Status CreateGpuExecutor(Communicator* comm, const GpuOptions& options, int device,
                         CollectivePath* host, std::unique_ptr<GpuExecutor>* out);

}  // namespace hora
