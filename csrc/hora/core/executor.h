#pragma once
// Runs the responses a cycle produced, in order, on this rank: fuses
// adjacent compatible allreduces into one buffer, calls the communicator,
// unpacks and scales, and completes each caller's Work.
#include <memory>
#include <vector>

#include "hora/algo/allreduce_router.h"
#include "hora/comm/communicator.h"
#include "hora/core/config.h"
#include "hora/core/fusion_buffer.h"
#include "hora/core/message.h"
#include "hora/core/tensor_queue.h"

namespace hora {

class Executor {
 public:
  Executor(Communicator* comm, TensorQueue* queue, const Config& config)
      : comm_(comm), queue_(queue), fusion_threshold_bytes_(config.fusion_threshold_bytes) {}

  // A transport failure is returned after failing the affected Works; the
  // engine then stops.
  Status Run(const std::vector<Response>& responses);
  // The allreduce algorithms; set once before the first Run.
  void SetRouter(std::unique_ptr<AllreduceRouter> router) { router_ = std::move(router); }
  const AllreduceRouter* router() const { return router_.get(); }

 private:
  size_t FuseFrom(const std::vector<Response>& responses, size_t first) const;
  // Runs batch[0..batch_size) as one fused allreduce.
  Status RunAllreduce(const Response* batch, size_t batch_size);
  Status RunAllgather(const Response& response, TensorEntry& entry);
  Status RunBroadcast(const Response& response, TensorEntry& entry);
  Status RunAlltoall(const Response& response, TensorEntry& entry);
  Status RunReducescatter(const Response& response, TensorEntry& entry);

  Communicator* comm_;
  TensorQueue* queue_;
  int64_t fusion_threshold_bytes_;
  FusionBuffer fusion_buffer_;
  std::unique_ptr<AllreduceRouter> router_;
  std::vector<Piece> pieces_;
};

}  // namespace hora
