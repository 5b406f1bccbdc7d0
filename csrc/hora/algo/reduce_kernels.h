#pragma once
// acc[i] = acc[i] (op) other[i] for every element type the transports
// reduce natively (half types are widened to float32 before they get here).
// Plain loops over restrict pointers: the compiler vectorizes them, and the
// loops are memory-bound anyway.
#include <cstdint>

#include "hora/common/dtype.h"
#include "hora/core/message.h"

namespace hora {

void ReduceInto(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op);

}  // namespace hora
