#pragma once
// One POSIX shared-memory segment per host, shared by the host's ranks:
// a control block per rank (sequence flags, the process id) and a data area
// per rank. Created at init by local rank 0 with mode 0600 (no other user
// can open it) and unlinked as soon as every rank has mapped it, so no name
// is left in /dev/shm even if a process later crashes.
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "hora/comm/communicator.h"

namespace hora {

struct alignas(64) ShmControl {
  std::atomic<uint64_t> arrived{0};
  char pad0[56];
  std::atomic<uint64_t> reduced{0};
  char pad1[56];
  std::atomic<uint64_t> released{0};
  char pad2[56];
  pid_t pid = 0;
  char pad3[60];
};

class ShmSegment {
 public:
  // Collective over `comm`, whose ranks must all be on this host.
  static Status Create(Communicator* comm, int64_t data_bytes_per_rank,
                       std::unique_ptr<ShmSegment>* out);
  ~ShmSegment();

  ShmControl* control(int rank) const { return reinterpret_cast<ShmControl*>(base_) + rank; }
  char* data(int rank) const {
    return base_ + control_bytes_ +
           static_cast<int64_t>(rank) * (data_bytes_per_rank_ + kSkewBytes);
  }
  // Ranks' areas start at different offsets modulo 4 KiB, so the streams a
  // reduction reads and writes at once do not alias in the caches.
  static constexpr int64_t kSkewBytes = 64 * 33;
  int64_t data_bytes_per_rank() const { return data_bytes_per_rank_; }

 private:
  ShmSegment() = default;
  char* base_ = nullptr;
  int64_t total_bytes_ = 0;
  int64_t control_bytes_ = 0;
  int64_t data_bytes_per_rank_ = 0;
};

}  // namespace hora
