#pragma once
// Host memory the core owns: result buffers whose size is only known after
// negotiation, and the persistent staging buffers of fused collectives.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

namespace hora {

// 64-byte aligned host memory so reduction loops vectorize on any slice.
class OwnedBuffer {
 public:
  explicit OwnedBuffer(int64_t bytes) : size_(bytes) {
    const size_t rounded = static_cast<size_t>((bytes + 63) / 64 * 64);
    data_ = static_cast<char*>(std::aligned_alloc(64, rounded == 0 ? 64 : rounded));
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~OwnedBuffer() { std::free(data_); }
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;

  char* data() { return data_; }
  int64_t size() const { return size_; }

 private:
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
