#include "hora/common/collective.h"

namespace hora {

const char* CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllreduce: return "allreduce";
    case CollectiveKind::kAllgather: return "allgather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kAlltoall: return "alltoall";
    case CollectiveKind::kReducescatter: return "reducescatter";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kParameters: return "parameters";
    case CollectiveKind::kAddProcessSet: return "add_process_set";
    case CollectiveKind::kRemoveProcessSet: return "remove_process_set";
  }
  return "unknown";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm) {
  switch (algorithm) {
    case AllreduceAlgorithm::kAuto: return "auto";
    case AllreduceAlgorithm::kMpi: return "mpi";
    case AllreduceAlgorithm::kRing: return "ring";
    case AllreduceAlgorithm::kShm: return "shm";
    case AllreduceAlgorithm::kHierarchical: return "hierarchical";
  }
  return "unknown";
}

bool ParseAllreduceAlgorithm(const std::string& text, AllreduceAlgorithm* out) {
  for (AllreduceAlgorithm a :
       {AllreduceAlgorithm::kAuto, AllreduceAlgorithm::kMpi, AllreduceAlgorithm::kRing,
        AllreduceAlgorithm::kShm, AllreduceAlgorithm::kHierarchical}) {
    if (text == AllreduceAlgorithmName(a)) {
      *out = a;
      return true;
    }
  }
  return false;
}

}  // namespace hora
