#pragma once
// The core's only tensor type: a non-owning view of memory that some
// framework owns, plus the owned buffers the core hands back when an
// output's size is only known after negotiation (allgather, alltoall).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "hora/common/dtype.h"
#include "hora/common/owned_buffer.h"

namespace hora {

struct TensorView {
  void* data = nullptr;
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;
  int device = -1;  // -1 is host memory

  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t NumBytes() const { return NumElements() * DataTypeSize(dtype); }
};

// GPU memory the core allocated for a result whose size was only known after
// negotiation (allgather, alltoall, reducescatter on GPU tensors). `release`
// frees it, ordered after the work queued on the stream it was made for.
struct DeviceBuffer {
  void* data = nullptr;
  int64_t bytes = 0;
  int device = -1;
  std::function<void(void*)> release;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (release && data != nullptr) release(data);
  }
};

}  // namespace hora
