#include "hora/algo/shm_allreduce.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "hora/algo/kernels/kernel_set.h"
#include "hora/common/backoff.h"

namespace hora {
namespace {

// Elements reduced at a time inside a sub-slice, so the output block stays
// in L1 between the reduction passes and the streaming store.
constexpr int64_t kBlockBytes = 16 * 1024;

}  // namespace

ShmAllreduce::ShmAllreduce(ShmSegment* segment, int rank, int size)
    : segment_(segment),
      rank_(rank),
      size_(size),
      // With more ranks than cores a spinning rank would steal the core its
      // peer needs to make progress, so waiting yields at once.
      oversubscribed_(size > static_cast<int>(std::thread::hardware_concurrency())),
      slot_bytes_((segment->data_bytes_per_rank() / kSlots - kSlotSkewBytes) / 64 * 64) {}

Status ShmAllreduce::WaitAll(std::atomic<uint64_t> ShmControl::* flag, uint64_t target) {
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    const ShmControl* control = segment_->control(peer);
    Backoff backoff;
    uint64_t naps = 0;
    while ((control->*flag).load(std::memory_order_acquire) < target) {
      if (oversubscribed_) {
        sched_yield();  // the peer needs this core to make progress
      } else {
        backoff.Pause();
      }
      // Now and then make sure the peer still exists, so a crashed rank
      // turns into an error instead of a wait that never ends.
      if ((oversubscribed_ || backoff.Sleeping()) && (++naps & 0x3ff) == 0 &&
          kill(control->pid, 0) != 0 && errno == ESRCH) {
        return Status::Internal("rank " + std::to_string(peer) +
                                " exited during a shared-memory allreduce");
      }
    }
  }
  return Status::OK();
}

Status ShmAllreduce::Run(const PieceMap& map, DataType dtype, ReduceOp op, double factor,
                         const CrossStep* cross) {
  const KernelSet& k = Kernels();
  const int64_t element = DataTypeSize(dtype);
  const int64_t count = map.total();
  const bool scale = factor != 1.0;
  // A chunk is cut into size_ sub-slices of whole 64-byte lines where the
  // chunk is large enough.
  const int64_t line = std::max<int64_t>(1, 64 / element);
  const int64_t chunk_elements =
      std::max<int64_t>(1, slot_bytes_ / element / size_ / line * line) * size_;
  const int64_t block_elements = std::max<int64_t>(1, kBlockBytes / element);
  ShmControl* mine = segment_->control(rank_);

  for (int64_t start = 0; start < count; start += chunk_elements) {
    const int64_t n = std::min(chunk_elements, count - start);
    const uint64_t seq = ++sequence_;
    const int slot = static_cast<int>(seq % kSlots);
    // This slot was last used kSlots chunks ago: every peer must be done
    // reading it before it is overwritten.
    if (seq > kSlots) HORA_RETURN_IF_ERROR(WaitAll(&ShmControl::released, seq - kSlots));
    char* my_slot = Slot(rank_, slot);

    const int64_t base = n / size_, extra = n % size_;
    auto sub_begin = [&](int r) { return r * base + std::min<int64_t>(r, extra); };
    auto sub_count = [&](int r) { return base + (r < extra ? 1 : 0); };

    // 1. Publish the parts the peers reduce.
    for (int owner = 0; owner < size_; ++owner) {
      if (owner == rank_) continue;
      char* dst = my_slot + sub_begin(owner) * element;
      map.ForEach(start + sub_begin(owner), sub_count(owner),
                  [&](const char* in, char*, int64_t len, int64_t at) {
                    k.stream_copy(dst + at * element, in, len * element);
                  });
    }
    mine->arrived.store(seq, std::memory_order_release);
    HORA_RETURN_IF_ERROR(WaitAll(&ShmControl::arrived, seq));

    // 2. Reduce this rank's sub-slice.
    const int64_t my_begin = sub_begin(rank_), my_count = sub_count(rank_);
    char* my_result = my_slot + my_begin * element;
    if (cross != nullptr) {
      // The reduction lands in the slot, the cross-host step runs on it
      // there, and the outputs are filled from it.
      map.ForEach(start + my_begin, my_count, [&](const char* in, char*, int64_t len, int64_t at) {
        std::memcpy(my_result + at * element, in, len * element);
      });
      for (int peer = 0; peer < size_ && my_count > 0; ++peer) {
        if (peer == rank_) continue;
        k.reduce_into(my_result, Slot(peer, slot) + my_begin * element, my_count, dtype, op);
      }
      if (my_count > 0) HORA_RETURN_IF_ERROR((*cross)(my_result, my_count));
      if (scale) k.scale_copy(my_result, my_result, my_count, dtype, factor);
      map.ForEach(start + my_begin, my_count, [&](const char*, char* out, int64_t len, int64_t at) {
        std::memcpy(out, my_result + at * element, len * element);
      });
    } else {
      map.ForEach(start + my_begin, my_count,
                  [&](const char* in, char* out, int64_t len, int64_t at) {
                    for (int64_t b = 0; b < len; b += block_elements) {
                      const int64_t m = std::min(block_elements, len - b);
                      char* o = out + b * element;
                      if (in != out) std::memcpy(o, in + b * element, m * element);
                      const int64_t offset = (my_begin + at + b) * element;
                      for (int peer = 0; peer < size_; ++peer) {
                        if (peer != rank_)
                          k.reduce_into(o, Slot(peer, slot) + offset, m, dtype, op);
                      }
                      if (scale) k.scale_copy(o, o, m, dtype, factor);
                      k.stream_copy(my_slot + offset, o, m * element);
                    }
                  });
    }
    mine->reduced.store(seq, std::memory_order_release);
    HORA_RETURN_IF_ERROR(WaitAll(&ShmControl::reduced, seq));

    // 3. Collect the other sub-slices' results.
    for (int owner = 0; owner < size_; ++owner) {
      if (owner == rank_) continue;
      const char* src = Slot(owner, slot) + sub_begin(owner) * element;
      map.ForEach(start + sub_begin(owner), sub_count(owner),
                  [&](const char*, char* out, int64_t len, int64_t at) {
                    std::memcpy(out, src + at * element, len * element);
                  });
    }
    mine->released.store(seq, std::memory_order_release);
  }
  return Status::OK();
}

}  // namespace hora
