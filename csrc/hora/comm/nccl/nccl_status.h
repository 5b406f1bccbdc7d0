#pragma once
// NCCL results as Status, with NCCL's own last-error text where it has one.
#include <nccl.h>

#include <string>

#include "hora/common/status.h"

namespace hora {
namespace gpu {

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

}  // namespace gpu
}  // namespace hora

#define HORA_NCCL(call, comm) HORA_RETURN_IF_ERROR(::hora::gpu::NcclStatus((call), #call, (comm)))
