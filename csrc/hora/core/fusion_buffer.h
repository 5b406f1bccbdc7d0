#pragma once
// One persistent staging buffer per engine. Fused allreduces are packed into
// it, and half-precision tensors are widened into it; it grows on demand and
// is never freed while the engine runs, so steady-state training allocates
// nothing per step.
#include <memory>

#include "hora/core/tensor.h"

namespace hora {

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
