#pragma once
// GPU collectives of a CUDA build: NCCL (comm/nccl) moves the bytes on one
// stream of the executor's own, the CUDA kernels of cuda/gpu_kernels.h
// pack, scale and cast around it, and the CollectivePlan says how much goes
// where.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "hora/comm/nccl/nccl_communicator.h"
#include "hora/core/gpu_stream_executor.h"
#include "hora/cuda/gpu_kernels.h"

namespace hora {
namespace gpu {

class NcclExecutor : public StreamExecutor {
 public:
  // Collective over `comm` (every rank makes one, or none).
  static Status Create(Communicator* comm, bool hierarchical, std::unique_ptr<GpuStream> stream,
                       std::unique_ptr<GpuExecutor>* out);
  ~NcclExecutor() override;

  Status Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                   const std::vector<bool>& present, const CollectivePlan& plan) override;
  Status Run(const Response& response, TensorEntry& entry, const CollectivePlan& plan) override;
  std::string Describe() const override;

 private:
  NcclExecutor(Communicator* comm, std::unique_ptr<GpuStream> stream)
      : StreamExecutor(std::move(stream)), comm_(comm) {}
  Status Init(bool hierarchical);
  // The persistent device scratch (fusion) buffer, grown on demand.
  Status Scratch(int64_t bytes, char** out);
  Status Copy(const void* src, void* dst, int64_t count, DataType in, DataType out, double scale,
              int64_t divisor);
  Status Reduce(const char* send, char* recv, int64_t count, DataType wire, ReduceOp op);
  Status Allgather(TensorEntry& entry, const CollectivePlan& plan);
  Status Broadcast(const Response& response, TensorEntry& entry);
  Status Alltoall(TensorEntry& entry, const CollectivePlan& plan);
  Status Reducescatter(const Response& response, TensorEntry& entry, const CollectivePlan& plan);

  Communicator* comm_;
  std::unique_ptr<NcclCommunicator> nccl_;
  std::unique_ptr<NcclCommunicator> local_;  // hierarchical: the ranks of this host
  char* scratch_ = nullptr;
  int64_t scratch_bytes_ = 0;
  std::vector<char> host_;   // hierarchical: the shard crossing hosts
  std::vector<float> wide_;  // ... widened to float32 for MPI
  std::vector<CopyTask> tasks_;
  std::vector<CopyTask> back_;
};

}  // namespace gpu
}  // namespace hora
