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
// Large buffers are aligned to 2 MiB and asked for transparent huge pages:
// a result buffer is new for every collective, and first touching 32 MiB
// in 4 KiB pages took 8 page faults per 32 KiB, more time than the
// allgather that filled it (NumPy asks the same for its large arrays).
class OwnedBuffer {
 public:
  explicit OwnedBuffer(int64_t bytes) : size_(bytes) {
    const size_t alignment = bytes >= kHugeBytes ? kHugeBytes : 64;
    const size_t rounded = static_cast<size_t>((bytes + alignment - 1) / alignment * alignment);
    data_ = static_cast<char*>(std::aligned_alloc(alignment, rounded == 0 ? 64 : rounded));
    if (data_ == nullptr) throw HostAllocationError(bytes);
#ifdef MADV_HUGEPAGE
    if (alignment == kHugeBytes) madvise(data_, rounded, MADV_HUGEPAGE);
#endif
  }
  ~OwnedBuffer() { std::free(data_); }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;

  char* data() { return data_; }
  int64_t size() const { return size_; }

 private:
  static constexpr int64_t kHugeBytes = 2 << 20;
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
