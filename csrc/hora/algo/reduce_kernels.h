#pragma once
// acc[i] = acc[i] (op) other[i] for every element type the transports
// reduce natively (half types are widened to float32 before they get here).
// Runs the kernel set chosen for this CPU (see kernels/kernel_set.h).
#include <cstdint>

#include "hora/common/dtype.h"
#include "hora/common/collective.h"

namespace hora {

void ReduceInto(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op);

}  // namespace hora
