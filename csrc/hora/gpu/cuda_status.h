#pragma once
// CUDA and NCCL results as Status, and a guard that switches the calling
// thread's current device for a scope.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string>

#include "hora/common/status.h"

namespace hora {
namespace gpu {

inline Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return Status::OK();
  return Status::Internal(std::string(what) + " failed: " + cudaGetErrorName(error) + " (" +
                          cudaGetErrorString(error) + ")");
}

inline Status NcclStatus(ncclResult_t result, const char* what, ncclComm_t comm = nullptr) {
  if (result == ncclSuccess) return Status::OK();
  std::string message = std::string(what) + " failed: " + ncclGetErrorString(result);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') message += " (" + std::string(last) + ")";
  if (result == ncclInvalidArgument || result == ncclInvalidUsage) {
    return Status::InvalidArgument(message);
  }
  return Status::Internal(message);
}

#define HORA_CUDA(call) HORA_RETURN_IF_ERROR(::hora::gpu::CudaStatus((call), #call))
#define HORA_NCCL(call, comm) HORA_RETURN_IF_ERROR(::hora::gpu::NcclStatus((call), #call, (comm)))

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
