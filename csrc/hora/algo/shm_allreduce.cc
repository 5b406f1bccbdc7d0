#include "hora/algo/shm_allreduce.h"

#include <sched.h>
#include <cerrno>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "hora/algo/reduce_kernels.h"

namespace hora {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ShmAllreduce::ShmAllreduce(ShmSegment* segment, int rank, int size)
    : segment_(segment),
      rank_(rank),
      size_(size),
      // With more ranks than cores a spinning rank would steal the core its
      // peer needs to make progress, so waiting yields at once.
      oversubscribed_(size > static_cast<int>(std::thread::hardware_concurrency())),
      slot_bytes_((segment->data_bytes_per_rank() / kSlots - kSlotSkewBytes) / 64 * 64) {}

Status ShmAllreduce::WaitAll(std::atomic<uint64_t> ShmControl::*flag, uint64_t target) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const ShmControl* control = segment_->control(peer);
    uint64_t spins = 0;
    while ((control->*flag).load(std::memory_order_acquire) < target) {
      ++spins;
      if (oversubscribed_ || spins > 4096) {
        sched_yield();
      } else {
        CpuRelax();
      }
      // Now and then make sure the peer still exists, so a crashed rank
      // turns into an error instead of a spin that never ends.
      if ((spins & 0xffff) == 0 && kill(control->pid, 0) != 0 && errno == ESRCH) {
        return Status::Internal("rank " + std::to_string(peer) +
                                " exited during a shared-memory allreduce");
      }
    }
  }
  return Status::OK();
}

Status ShmAllreduce::Run(const void* send, void* recv, int64_t count, DataType dtype, ReduceOp op) {
  const int64_t element = DataTypeSize(dtype);
  // A chunk is cut into size_ sub-slices, each a whole number of elements
  // aligned to 64 bytes where the chunk is large enough.
  const int64_t chunk_elements = std::max<int64_t>(1, slot_bytes_ / element / size_ / 16 * 16) * size_;
  const char* input = static_cast<const char*>(send == nullptr ? recv : send);
  char* output = static_cast<char*>(recv);
  ShmControl* mine = segment_->control(rank_);

  for (int64_t start = 0; start < count || (count == 0 && start == 0); start += chunk_elements) {
    const int64_t n = std::min(chunk_elements, count - start);
    const uint64_t seq = ++sequence_;
    const int slot = static_cast<int>(seq % kSlots);
    // This slot was last used kSlots chunks ago: every peer must be done
    // reading it before it is overwritten.
    if (seq > kSlots) HORA_RETURN_IF_ERROR(WaitAll(&ShmControl::released, seq - kSlots));
    char* my_slot = segment_->data(rank_) + slot * (slot_bytes_ + kSlotSkewBytes);
    std::memcpy(my_slot, input + start * element, n * element);
    mine->arrived.store(seq, std::memory_order_release);
    HORA_RETURN_IF_ERROR(WaitAll(&ShmControl::arrived, seq));

    const int64_t base = n / size_, extra = n % size_;
    auto sub_begin = [&](int r) { return r * base + std::min<int64_t>(r, extra); };
    auto sub_count = [&](int r) { return base + (r < extra ? 1 : 0); };
    const int64_t my_begin = sub_begin(rank_), my_count = sub_count(rank_);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || my_count == 0) continue;
      const char* peer_slot = segment_->data(peer) + slot * (slot_bytes_ + kSlotSkewBytes);
      ReduceInto(my_slot + my_begin * element, peer_slot + my_begin * element, my_count, dtype, op);
    }
    mine->reduced.store(seq, std::memory_order_release);
    HORA_RETURN_IF_ERROR(WaitAll(&ShmControl::reduced, seq));

    for (int owner = 0; owner < size_; ++owner) {
      const int64_t begin = sub_begin(owner), length = sub_count(owner);
      if (length == 0) continue;
      const char* owner_slot = segment_->data(owner) + slot * (slot_bytes_ + kSlotSkewBytes);
      std::memcpy(output + (start + begin) * element, owner_slot + begin * element, length * element);
    }
    mine->released.store(seq, std::memory_order_release);
    if (count == 0) break;
  }
  return Status::OK();
}

}  // namespace hora
