#pragma once
// Runs one (possibly fused) host allreduce: chooses the algorithm, and
// decides whether the callers' tensors can be reduced where they are or
// must be staged into one contiguous buffer first.
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
// (Piece lists); the others work on one contiguous buffer, so several
// pieces, half types (reduced in float32) and pre-scaled inputs are staged.
#include <memory>
#include <string>

#include "hora/algo/pieces.h"
#include "hora/algo/ring_allreduce.h"
#include "hora/algo/shm_allreduce.h"
#include "hora/comm/communicator.h"
#include "hora/common/collective.h"
#include "hora/common/owned_buffer.h"

namespace hora {

enum class AllreducePath { kMpi, kRing, kShm, kHierarchical };
const char* AllreducePathName(AllreducePath path);

struct AllreduceSettings {
  AllreduceAlgorithm algorithm = AllreduceAlgorithm::kAuto;
  // "auto": allreduces up to this many bytes use MPI's latency-optimal one.
  int64_t small_allreduce_bytes = 64 * 1024;
  // Bytes of one shared-memory pipeline slot (ShmAllreduce::kSlots per rank).
  int64_t shm_slot_bytes = 1024 * 1024;
};

class AllreduceRouter {
 public:
  // Collective: creates the shared-memory segment when a path needs one.
  static Status Create(Communicator* comm, const AllreduceSettings& settings,
                       std::unique_ptr<AllreduceRouter>* out);

  // The path for `bytes` of reduction (in the type reduced on the wire).
  AllreducePath Choose(int64_t bytes) const;
  // Whether "auto" may pick the hierarchical path on several hosts (false:
  // a flat ring across all ranks). Autotuning flips it on every rank at once.
  void SetHierarchical(bool allowed) { hierarchical_allowed_ = allowed; }
  bool HierarchicalAvailable() const {
    return settings_.algorithm == AllreduceAlgorithm::kAuto && !one_host_ && hierarchical_ok_ &&
           shm_ != nullptr;
  }

  // out[k] = reduce over ranks of (in[k] * prescale), times `factor`, for
  // the pieces laid end to end (a contiguous buffer is one piece; `in` may
  // equal `out`). Integer types are neither pre- nor post-scaled. Every
  // rank must pass the same dtype, op, prescale and total count; the pieces
  // themselves may differ (a rank that has joined passes neutral values).
  Status Run(const Piece* pieces, size_t n, DataType dtype, ReduceOp op, double prescale,
             double factor);

  std::string Describe() const;

  // Whether a reducescatter (allgather) of `bytes` in all (in the wire
  // type; for an allgather its result) goes around the ring: MPI's own
  // collective serves small messages and the "mpi" algorithm; larger ones
  // take the pipelined ring, whose speed does not fall off a cliff at some
  // size as Open MPI's shared-memory ones do (2 ranks, one host: its
  // reduce-scatter 4.7 ms for 16 MiB and 26 ms for 32 MiB, the ring 4.1 and
  // 10.4 ms; its allgather into a new 16 MiB buffer 1.4 ms and into 32 MiB
  // 18.6 ms, the ring 2.3 and 5.2 ms, so that allgather switches later).
  bool RingFor(int64_t bytes) const;
  bool RingForAllgather(int64_t bytes) const {
    return RingFor(bytes) && bytes > kRingAllgatherBytes;
  }
  static constexpr int64_t kRingAllgatherBytes = 16 << 20;
  RingAllreduce& ring() { return ring_; }

 private:
  AllreduceRouter(Communicator* comm, const AllreduceSettings& settings)
      : comm_(comm), settings_(settings) {}
  // The pieces themselves, through the shared-memory paths (or a copy alone).
  Status RunPieces(const Piece* pieces, size_t n, DataType dtype, ReduceOp op, double factor);
  // One contiguous buffer; `send == nullptr` means in place. No scaling.
  Status RunContiguous(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op);

  Communicator* comm_;
  AllreduceSettings settings_;
  bool one_host_ = false;
  bool hierarchical_ok_ = false;
  bool hierarchical_allowed_ = true;
  std::unique_ptr<ShmSegment> segment_;
  std::unique_ptr<ShmAllreduce> shm_;
  RingAllreduce ring_;
  RingAllreduce cross_ring_;
  FusionBuffer staging_;
};

}  // namespace hora
