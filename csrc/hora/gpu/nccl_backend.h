#pragma once
// GPU collectives over NCCL, on one stream of the backend's own, with the
// CUDA kernels of gpu_kernels.h for packing, scaling and casts.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <memory>
#include <vector>

#include "hora/gpu/gpu_backend.h"
#include "hora/gpu/gpu_kernels.h"

namespace hora {
namespace gpu {

class NcclBackend : public GpuBackend {
 public:
  static Status Create(Communicator* comm, const Config& config, int device,
                       std::unique_ptr<GpuBackend>* out);
  ~NcclBackend() override;

  Status Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                   const std::vector<bool>& present) override;
  Status Allgather(const Response& response, TensorEntry& entry) override;
  Status Broadcast(const Response& response, TensorEntry& entry) override;
  Status Alltoall(const Response& response, TensorEntry& entry) override;
  Status Reducescatter(const Response& response, TensorEntry& entry) override;
  std::string Describe() const override;

 private:
  NcclBackend(Communicator* comm, int device) : comm_(comm), device_(device) {}
  Status Init(const Config& config);
  // Fails on every rank alike when two ranks of one host hold the same GPU.
  Status CheckDistinctDevices();
  Status InitComm(Communicator* over, ncclComm_t* out);
  // The backend's stream waits for what the callers queued before submitting.
  Status WaitForCallers(TensorEntry* entries, size_t count, const std::vector<bool>* present);
  // Each caller's stream waits for everything queued on ours so far.
  Status ReleaseCallers(TensorEntry* entries, size_t count, const std::vector<bool>* present);
  // The persistent device scratch (fusion) buffer, grown on demand.
  Status Scratch(int64_t bytes, char** out);
  // Result memory for the caller, allocated in order on our stream; once
  // HandOver has run it is freed in order on the caller's stream.
  Status AllocateOutput(int64_t bytes, std::shared_ptr<DeviceBuffer>* out);
  void HandOver(DeviceBuffer* buffer, uintptr_t caller_stream);
  Status Copy(const void* src, void* dst, int64_t count, DataType in, DataType out, double scale,
              int64_t divisor);
  Status Reduce(const char* send, char* recv, int64_t count, DataType wire, ReduceOp op);

  Communicator* comm_;
  int device_;
  bool hierarchical_ = false;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  ncclComm_t local_ = nullptr;  // hierarchical: the ranks of this host
  char* scratch_ = nullptr;
  int64_t scratch_bytes_ = 0;
  std::vector<char> host_;   // hierarchical: the shard crossing hosts
  std::vector<float> wide_;  // ... widened to float32 for MPI
  std::vector<CopyTask> tasks_;
  std::vector<CopyTask> back_;
};

}  // namespace gpu
}  // namespace hora
