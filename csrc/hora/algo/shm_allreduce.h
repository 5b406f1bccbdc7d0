#pragma once
// Allreduce among the ranks of one host through a shared-memory segment.
//
// The logical buffer (callers' tensors end to end, see pieces.h) is
// processed in chunks. Each chunk is cut into one sub-slice per rank. Per
// chunk:
//   1. every rank streams the sub-slices *other* ranks own from its input
//      into its slot (its own sub-slice never leaves its memory);
//   2. rank r reduces sub-slice r from its own input and every peer's slot
//      straight into its output, applies the scale factor, and streams the
//      result into its slot;
//   3. every rank copies the other sub-slices' results from their owners'
//      slots into its output.
// Stores that a peer reads next bypass the cache (stream_copy), so the
// reader fetches them from memory rather than from another core's cache;
// on VMs whose vCPUs land on different dies that is the difference between
// 2x faster and 1.5x slower than MPI (see docs/performance.md). kSlots slots
// per rank let ranks run a few chunks apart without waiting.
//
// Hierarchical use: with a `cross` step, rank r's reduced sub-slice is
// handed to it (e.g. a ring allreduce among the ranks with this local rank
// on every host) before the result is published in step 2.
#include <atomic>
#include <cstdint>
#include <functional>

#include "hora/algo/pieces.h"
#include "hora/comm/shm/shm_segment.h"
#include "hora/common/collective.h"

namespace hora {

class ShmAllreduce {
 public:
  using CrossStep = std::function<Status(void* data, int64_t count)>;

  ShmAllreduce(ShmSegment* segment, int rank, int size);

  // out = reduce(in over ranks) * factor (factor only for floating types;
  // integers get exactly the reduction). Half types are not accepted here.
  Status Run(const PieceMap& map, DataType dtype, ReduceOp op, double factor,
             const CrossStep* cross = nullptr);

  static constexpr int kSlots = 4;
  static constexpr int64_t kSlotSkewBytes = 64 * 17;

 private:
  // Waits until every peer's `flag` reaches `target`; fails if a peer died.
  Status WaitAll(std::atomic<uint64_t> ShmControl::* flag, uint64_t target);
  char* Slot(int rank, int slot) const {
    return segment_->data(rank) + slot * (slot_bytes_ + kSlotSkewBytes);
  }

  ShmSegment* segment_;
  int rank_;
  int size_;
  bool oversubscribed_;
  int64_t slot_bytes_;
  uint64_t sequence_ = 0;
};

}  // namespace hora
