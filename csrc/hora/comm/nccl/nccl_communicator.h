#pragma once
// The device-memory transport: NCCL collectives on buffers in GPU memory,
// queued on a stream the caller gives. It knows nothing of requests or
// tensors; the GPU executor (core/) decides what to send where.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/common/collective.h"
#include "hora/common/dtype.h"
#include "hora/common/status.h"

namespace hora {
namespace gpu {

class NcclCommunicator {
 public:
  // Collective over `over` (a host communicator, which carries NCCL's
  // unique id from its rank 0): one NCCL rank per rank of `over`, on the
  // calling thread's current device.
  static Status Create(Communicator* over, std::unique_ptr<NcclCommunicator>* out);
  // Aborts: the peers may be gone, and a graceful destroy would wait for them.
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Counts are in elements of `wire` (a type NCCL has: no int16), offsets
  // too; `send` may equal `recv` where NCCL allows it (in place).
  Status Allreduce(const void* send, void* recv, int64_t count, DataType wire, ReduceOp op,
                   cudaStream_t stream);
  // Rank k's block of `counts[k]` elements (at `offsets[k]` of `send`) is
  // reduced into rank k's `recv`.
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& counts,
                       const std::vector<int64_t>& offsets, bool equal, DataType wire, ReduceOp op,
                       cudaStream_t stream);
  // Bytes: rank k's `send` lands at `offsets[k]` of everyone's `recv`.
  Status Allgatherv(const void* send, void* recv, const std::vector<int64_t>& bytes,
                    const std::vector<int64_t>& offsets, bool equal, cudaStream_t stream);
  Status Broadcast(const void* send, void* recv, int64_t bytes, int root, cudaStream_t stream);
  // Bytes, per peer, with the offsets of each peer's block on both sides.
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                   const std::vector<int64_t>& send_offsets, void* recv,
                   const std::vector<int64_t>& recv_bytes, const std::vector<int64_t>& recv_offsets,
                   cudaStream_t stream);

 private:
  NcclCommunicator() = default;

  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

// NCCL versions (compiled against, loaded now) for build_info().
std::map<std::string, std::string> NcclVersionInfo();
// "NCCL 2.28.3".
std::string NcclDescribe();

}  // namespace gpu
}  // namespace hora
