#pragma once
// Chooses and runs the allreduce algorithm for each call.
//
//   mpi           the MPI library's own allreduce (latency-optimal for small
//                 messages; what "auto" uses up to small_allreduce_bytes)
//   ring          RingAllreduce over point-to-point
//   shm           ShmAllreduce, when every rank is on one host
//   hierarchical  shared memory inside each host with a ring across hosts
//                 on each rank's sub-slice
//
// "auto" is mpi for small messages, then shm on one host, hierarchical on
// several hosts with the same number of ranks each, and ring otherwise.
// The shared-memory paths reduce straight between the callers' tensors
// (Piece lists); the others work on one contiguous buffer.
#include <memory>
#include <string>

#include "hora/algo/pieces.h"
#include "hora/algo/ring_allreduce.h"
#include "hora/algo/shm_allreduce.h"
#include "hora/comm/communicator.h"
#include "hora/core/config.h"

namespace hora {

enum class AllreducePath { kMpi, kRing, kShm, kHierarchical };
const char* AllreducePathName(AllreducePath path);

class AllreduceRouter {
 public:
  // Collective: creates the shared-memory segment when a path needs one.
  static Status Create(Communicator* comm, const Config& config,
                       std::unique_ptr<AllreduceRouter>* out);

  AllreducePath Choose(int64_t bytes) const;
  // Whether "auto" may pick the hierarchical path on several hosts (false:
  // a flat ring across all ranks). Autotuning flips it on every rank at once.
  void SetHierarchical(bool allowed) { hierarchical_allowed_ = allowed; }
  bool HierarchicalAvailable() const {
    return config_.allreduce_algorithm == "auto" && !one_host_ && hierarchical_ok_ &&
           shm_ != nullptr;
  }
  // Whether Choose(bytes) reads and writes Piece lists directly (always,
  // alone: the result is the input, copied only where it must move).
  bool TakesPieces(int64_t bytes) const {
    if (comm_->size() == 1) return true;
    const AllreducePath path = Choose(bytes);
    return path == AllreducePath::kShm || path == AllreducePath::kHierarchical;
  }

  // out = reduce(in) * factor over the pieces (floating types; integers
  // are not scaled). Half types are widened by the caller.
  Status Run(const Piece* pieces, size_t n, DataType dtype, ReduceOp op, double factor);
  // Contiguous form; `send == nullptr` means in place. No scaling.
  Status Run(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op);

  std::string Describe() const;

 private:
  AllreduceRouter(Communicator* comm, const Config& config) : comm_(comm), config_(config) {}

  Communicator* comm_;
  Config config_;
  bool one_host_ = false;
  bool hierarchical_ok_ = false;
  bool hierarchical_allowed_ = true;
  std::unique_ptr<ShmSegment> segment_;
  std::unique_ptr<ShmAllreduce> shm_;
  RingAllreduce ring_;
  RingAllreduce cross_ring_;
};

}  // namespace hora
