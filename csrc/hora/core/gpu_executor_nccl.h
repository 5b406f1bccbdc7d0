#pragma once
// GPU collectives of a CUDA build: NCCL (comm/nccl) moves the bytes on one
// stream of the executor's own, the CUDA kernels of cuda/gpu_kernels.h
// pack, scale and cast around it, and the CollectivePlan says how much goes
// where.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "hora/comm/nccl/nccl_communicator.h"
#include "hora/core/gpu_executor.h"
#include "hora/cuda/gpu_kernels.h"

namespace hora {
namespace gpu {

class NcclExecutor : public GpuExecutor {
 public:
  static Status Create(Communicator* comm, bool hierarchical, int device,
                       std::unique_ptr<GpuExecutor>* out);
  ~NcclExecutor() override;

  Status Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                   const std::vector<bool>& present, const CollectivePlan& plan) override;
  Status Run(const Response& response, TensorEntry& entry, const CollectivePlan& plan) override;
  std::string Describe() const override;

 private:
  NcclExecutor(Communicator* comm, int device) : comm_(comm), device_(device) {}
  Status Init(bool hierarchical);
  // Fails on every rank alike when two ranks of one host hold the same GPU.
  Status CheckDistinctDevices();
  // Our stream waits for what the callers queued before submitting.
  Status WaitForCallers(TensorEntry* entries, size_t count, const std::vector<bool>* present);
  // Each caller's stream waits for everything queued on ours so far.
  Status ReleaseCallers(TensorEntry* entries, size_t count, const std::vector<bool>* present);
  // The persistent device scratch (fusion) buffer, grown on demand.
  Status Scratch(int64_t bytes, char** out);
  // Result memory for the caller, allocated in order on our stream; once
  // HandOver has run it is freed in order on the caller's stream.
  Status AllocateOutput(int64_t bytes, std::shared_ptr<DeviceBuffer>* out);
  void HandOver(DeviceBuffer* buffer, uintptr_t caller_stream);
  // Gives `entry` the result in `out`, shaped as the plan says.
  Status Deliver(TensorEntry& entry, std::shared_ptr<DeviceBuffer> out, const CollectivePlan& plan);
  Status Copy(const void* src, void* dst, int64_t count, DataType in, DataType out, double scale,
              int64_t divisor);
  Status Reduce(const char* send, char* recv, int64_t count, DataType wire, ReduceOp op);
  Status Allgather(TensorEntry& entry, const CollectivePlan& plan);
  Status Broadcast(const Response& response, TensorEntry& entry);
  Status Alltoall(TensorEntry& entry, const CollectivePlan& plan);
  Status Reducescatter(const Response& response, TensorEntry& entry, const CollectivePlan& plan);

  Communicator* comm_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
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
