#pragma once
// Element-wise loops on host memory that the collectives need around the
// transport: scaling, integer averaging, neutral fills for joined ranks, and
// the float16/bfloat16 <-> float32 staging that lets half types reduce with
// float32 accumulation.
#include <cstdint>

#include "hora/common/dtype.h"
#include "hora/common/collective.h"

namespace hora {

// dst[i] = src[i] * factor for floating types (src may equal dst).
void ScaleCopy(const void* src, void* dst, int64_t count, DataType dtype, double factor);
// buf[i] /= divisor for integer types, truncating toward zero.
void DivideInPlace(void* buf, int64_t count, DataType dtype, int64_t divisor);
// Fills with the value that leaves `op` unchanged (0 for sums, 1 for
// products, the largest value for Min, the lowest for Max).
void FillNeutral(void* buf, int64_t count, DataType dtype, ReduceOp op);
// float16/bfloat16 -> float32 with an optional factor, and back.
void WidenToFloat(const void* src, float* dst, int64_t count, DataType dtype, double factor);
void NarrowFromFloat(const float* src, void* dst, int64_t count, DataType dtype, double factor);

inline bool IsHalf(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

}  // namespace hora
