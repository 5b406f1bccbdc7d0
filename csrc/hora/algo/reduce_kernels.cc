#include "hora/algo/reduce_kernels.h"

#include "hora/algo/kernels/kernel_set.h"

namespace hora {

void ReduceInto(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op) {
  Kernels().reduce_into(acc, other, count, dtype, op);
}

}  // namespace hora
