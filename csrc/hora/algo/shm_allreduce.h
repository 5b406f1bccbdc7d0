#pragma once
// Allreduce among the ranks of one host through a shared-memory segment.
//
// The buffer is processed in chunks small enough to stay in cache. For each
// chunk every rank copies its piece into its slot; then rank r reduces the
// r-th sub-slice of the chunk straight from every rank's slot into its own;
// then every rank copies all reduced sub-slices out. Each byte crosses
// memory a few times inside the cache instead of going through MPI's
// protocol stack, and two slots per rank let one chunk's copy-out overlap
// the next chunk's copy-in.
#include <cstdint>

#include "hora/comm/shm/shm_segment.h"
#include "hora/core/message.h"

namespace hora {

class ShmAllreduce {
 public:
  ShmAllreduce(ShmSegment* segment, int rank, int size);

  // `send == nullptr` means in place on `recv`.
  Status Run(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op);

  static constexpr int kSlots = 2;
  static constexpr int64_t kSlotSkewBytes = 64 * 17;

 private:
  // Waits until every peer's `flag` reaches `target`; fails if a peer died.
  Status WaitAll(std::atomic<uint64_t> ShmControl::*flag, uint64_t target);

  ShmSegment* segment_;
  int rank_;
  int size_;
  bool oversubscribed_;
  int64_t slot_bytes_;
  uint64_t sequence_ = 0;
};

}  // namespace hora
