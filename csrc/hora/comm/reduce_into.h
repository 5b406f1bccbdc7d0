#pragma once
// An element-wise reduction of `other` into `acc`, a plain loop for the
// transports that reduce on their own (the in-process and TCP ones); the
// engine's fast kernels live in algo/, a layer above.
#include <cstdint>

#include "hora/common/collective.h"
#include "hora/common/dtype.h"
#include "hora/common/status.h"

namespace hora {

// Half types are not handled (the caller widens them); `transport` names
// the caller in the error for those.
Status ReduceInto(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op,
                  const char* transport);

}  // namespace hora
