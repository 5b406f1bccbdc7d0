#include "hora/comm/nccl/nccl_communicator.h"

#include "hora/comm/nccl/nccl_status.h"
#include "hora/common/build_config.h"
#include "hora/cuda/cuda_status.h"

namespace hora {
namespace gpu {
namespace {

ncclDataType_t NcclType(DataType wire) {
  switch (wire) {
    case DataType::kUInt8:
    case DataType::kBool: return ncclUint8;
    case DataType::kInt8: return ncclInt8;
    case DataType::kInt64: return ncclInt64;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat64: return ncclFloat64;
    default: return ncclInt32;
  }
}

// Bool Sum is a logical or, bool Product a logical and.
ncclRedOp_t NcclOp(ReduceOp op, DataType wire) {
  const bool logical = wire == DataType::kBool;
  switch (op) {
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return logical ? ncclMin : ncclProd;
    default: return logical ? ncclMax : ncclSum;  // Sum, and Average before its scaling
  }
}

std::string VersionText(int code) {
  // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
         std::to_string(code % 100);
}

// Runs NCCL calls between ncclGroupStart and ncclGroupEnd, keeping the
// first failure but always closing the group.
class Group {
 public:
  explicit Group(ncclComm_t comm) : comm_(comm) {
    status_ = NcclStatus(ncclGroupStart(), "ncclGroupStart");
  }
  void Add(ncclResult_t result, const char* what) {
    if (status_.ok()) status_ = NcclStatus(result, what, comm_);
  }
  Status End() {
    Status end = NcclStatus(ncclGroupEnd(), "ncclGroupEnd", comm_);
    return status_.ok() ? end : status_;
  }

 private:
  ncclComm_t comm_;
  Status status_;
};

}  // namespace

Status NcclCommunicator::Create(Communicator* over, std::unique_ptr<NcclCommunicator>* out) {
  struct {
    int32_t ok;
    ncclUniqueId id;
  } message{};
  Status root_status;
  if (over->rank() == 0) {
    root_status = NcclStatus(ncclGetUniqueId(&message.id), "ncclGetUniqueId");
    message.ok = root_status.ok() ? 1 : 0;
  }
  HORA_RETURN_IF_ERROR(over->Broadcast(&message, sizeof(message), 0));
  if (!message.ok) {
    return over->rank() == 0 ? root_status
                             : Status::Internal("NCCL setup failed on rank 0; see its error");
  }
  std::unique_ptr<NcclCommunicator> comm(new NcclCommunicator());
  comm->rank_ = over->rank();
  comm->size_ = over->size();
  HORA_NCCL(ncclCommInitRank(&comm->comm_, comm->size_, message.id, comm->rank_), nullptr);
  *out = std::move(comm);
  return Status::OK();
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ != nullptr) ncclCommAbort(comm_);
}

Status NcclCommunicator::Allreduce(const void* send, void* recv, int64_t count, DataType wire,
                                   ReduceOp op, cudaStream_t stream) {
  HORA_NCCL(ncclAllReduce(send, recv, count, NcclType(wire), NcclOp(op, wire), comm_, stream),
            comm_);
  return Status::OK();
}

Status NcclCommunicator::ReduceScatter(const void* send, void* recv,
                                       const std::vector<int64_t>& counts,
                                       const std::vector<int64_t>& offsets, bool equal,
                                       DataType wire, ReduceOp op, cudaStream_t stream) {
  const ncclDataType_t type = NcclType(wire);
  const ncclRedOp_t nccl_op = NcclOp(op, wire);
  if (equal) {
    if (counts[rank_] > 0) {
      HORA_NCCL(ncclReduceScatter(send, recv, counts[rank_], type, nccl_op, comm_, stream), comm_);
    }
    return Status::OK();
  }
  // Blocks of different sizes: one reduce to each rank, in one group.
  const int64_t element = DataTypeSize(wire);
  Group group(comm_);
  for (int k = 0; k < size_; ++k) {
    if (counts[k] == 0) continue;
    group.Add(ncclReduce(static_cast<const char*>(send) + offsets[k] * element, recv, counts[k],
                         type, nccl_op, k, comm_, stream),
              "ncclReduce (reducescatter)");
  }
  return group.End();
}

Status NcclCommunicator::Allgatherv(const void* send, void* recv, const std::vector<int64_t>& bytes,
                                    const std::vector<int64_t>& offsets, bool equal,
                                    cudaStream_t stream) {
  if (equal) {
    if (bytes[0] > 0)
      HORA_NCCL(ncclAllGather(send, recv, bytes[0], ncclInt8, comm_, stream), comm_);
    return Status::OK();
  }
  // Ranks send different amounts: one broadcast per rank, in one group.
  Group group(comm_);
  for (int k = 0; k < size_; ++k) {
    if (bytes[k] == 0) continue;
    group.Add(ncclBroadcast(send, static_cast<char*>(recv) + offsets[k], bytes[k], ncclInt8, k,
                            comm_, stream),
              "ncclBroadcast (allgather)");
  }
  return group.End();
}

Status NcclCommunicator::Broadcast(const void* send, void* recv, int64_t bytes, int root,
                                   cudaStream_t stream) {
  if (bytes > 0) HORA_NCCL(ncclBroadcast(send, recv, bytes, ncclInt8, root, comm_, stream), comm_);
  return Status::OK();
}

Status NcclCommunicator::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                   const std::vector<int64_t>& send_offsets, void* recv,
                                   const std::vector<int64_t>& recv_bytes,
                                   const std::vector<int64_t>& recv_offsets, cudaStream_t stream) {
  const char* from = static_cast<const char*>(send);
  char* to = static_cast<char*>(recv);
  if (send_bytes[rank_] > 0) {
    HORA_CUDA(cudaMemcpyAsync(to + recv_offsets[rank_], from + send_offsets[rank_],
                              send_bytes[rank_], cudaMemcpyDeviceToDevice, stream));
  }
  Group group(comm_);
  for (int k = 0; k < size_; ++k) {
    if (k == rank_) continue;
    if (send_bytes[k] > 0) {
      group.Add(ncclSend(from + send_offsets[k], send_bytes[k], ncclInt8, k, comm_, stream),
                "ncclSend");
    }
    if (recv_bytes[k] > 0) {
      group.Add(ncclRecv(to + recv_offsets[k], recv_bytes[k], ncclInt8, k, comm_, stream),
                "ncclRecv");
    }
  }
  return group.End();
}

std::map<std::string, std::string> NcclVersionInfo() {
  std::map<std::string, std::string> info;
  info["nccl_compiled"] = std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
                          std::to_string(NCCL_PATCH);
  int loaded = 0;
  info["nccl"] = ncclGetVersion(&loaded) == ncclSuccess ? VersionText(loaded) : "unknown";
  info["nccl_source"] = HORA_NCCL_SOURCE;
  return info;
}

std::string NcclDescribe() {
  int loaded = 0;
  ncclGetVersion(&loaded);
  return "NCCL " + VersionText(loaded);
}

}  // namespace gpu
}  // namespace hora
