#pragma once
// Host memory the core owns: result buffers whose size is only known after
// negotiation, and the persistent staging buffers of fused collectives.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace hora {

// Thrown when host memory runs out: a std::bad_alloc that says how much
// was asked for.
class HostAllocationError : public std::bad_alloc {
 public:
  explicit HostAllocationError(int64_t bytes)
      : message_("could not allocate " + std::to_string(bytes) + " bytes of host memory") {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// 64-byte aligned host memory so reduction loops vectorize on any slice.
// A large buffer asks for transparent huge pages on the 2 MiB pages inside
// it: a result buffer is new for every collective, and first touching a
// fresh 32 MiB in 4 KiB pages took longer than the allgather that filled it
// (NumPy asks the same for its large arrays). The alignment stays 64 bytes:
// aligned to 2 MiB, glibc maps every buffer afresh instead of reusing freed
// memory, which made a 4 MiB allgather 4x slower.
class OwnedBuffer {
 public:
  explicit OwnedBuffer(int64_t bytes) : size_(bytes) {
    const size_t rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
    data_ = static_cast<char*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
    if (data_ == nullptr) throw HostAllocationError(bytes);
#ifdef MADV_HUGEPAGE
    if (bytes >= 2 * kHugeBytes) {
      const uintptr_t begin = reinterpret_cast<uintptr_t>(data_);
      const uintptr_t first = (begin + kHugeBytes - 1) / kHugeBytes * kHugeBytes;
      const uintptr_t last = (begin + static_cast<uintptr_t>(bytes)) / kHugeBytes * kHugeBytes;
      if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
    }
#endif
  }
  ~OwnedBuffer() { std::free(data_); }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;

  char* data() { return data_; }
  int64_t size() const { return size_; }

 private:
  static constexpr uintptr_t kHugeBytes = 2 << 20;
  char* data_;
  int64_t size_;
};

// A persistent staging buffer: fused tensors are packed into it and half-
// precision tensors widened into it. It grows on demand and is never freed
// while its owner lives, so steady-state training allocates nothing per step.
class FusionBuffer {
 public:
  char* Get(int64_t bytes) {
    if (!buffer_ || buffer_->size() < bytes) buffer_.reset(new OwnedBuffer(bytes));
    return buffer_->data();
  }

 private:
  std::unique_ptr<OwnedBuffer> buffer_;
};

}  // namespace hora
