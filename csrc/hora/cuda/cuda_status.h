#pragma once
// CUDA results as Status, and a guard that switches the calling
// thread's current device for a scope.
#include <cuda_runtime_api.h>

#include <string>

#include "hora/common/status.h"

namespace hora {
namespace gpu {

inline Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::OK();
  return Status::Internal(std::string(what) + " failed: " + cudaGetErrorName(error) + " (" +
                          cudaGetErrorString(error) + ")");
}

#define HORA_CUDA(call) HORA_RETURN_IF_ERROR(::hora::gpu::CudaStatus((call), #call))

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace gpu
}  // namespace hora
