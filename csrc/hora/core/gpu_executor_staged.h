#pragma once
// GPU collectives on host copies, for jobs in which ranks of one host share
// a GPU: NCCL refuses two ranks on one device, so each collective copies
// its inputs to pinned host memory, runs the CPU path on the copies
// (fusion, the allreduce algorithms, joined ranks, scaling, the
// size-negotiated outputs) and copies the results back, in order with the
// callers' streams. Correct and slow: it is for developing multi-rank code
// on a machine with fewer GPUs than ranks.
#include <memory>
#include <vector>

#include "hora/core/gpu_stream_executor.h"

namespace hora {
namespace gpu {

class StagedExecutor : public StreamExecutor {
 public:
  StagedExecutor(Communicator* comm, CollectivePath* host, std::unique_ptr<GpuStream> stream,
                 std::string why)
      : StreamExecutor(std::move(stream)), comm_(comm), host_(host), why_(std::move(why)) {}
  ~StagedExecutor() override;

  Status Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                   const std::vector<bool>& present, const CollectivePlan& plan) override;
  Status Run(const Response& response, TensorEntry& entry, const CollectivePlan& plan) override;
  std::string Describe() const override;

 private:
  // The pinned host buffer, grown on demand (its old contents are lost).
  Status Pinned(int64_t bytes, char** out);

  Communicator* comm_;
  CollectivePath* host_;
  std::string why_;
  char* pinned_ = nullptr;
  int64_t pinned_bytes_ = 0;
};

}  // namespace gpu
}  // namespace hora
