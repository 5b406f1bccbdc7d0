#include "hora/algo/reduce_kernels.h"

#include <algorithm>

namespace hora {
namespace {

template <typename T>
void SumInto(T* __restrict acc, const T* __restrict other, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += other[i];
}
template <typename T>
void ProductInto(T* __restrict acc, const T* __restrict other, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] *= other[i];
}
template <typename T>
void MinInto(T* __restrict acc, const T* __restrict other, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = other[i] < acc[i] ? other[i] : acc[i];
}
template <typename T>
void MaxInto(T* __restrict acc, const T* __restrict other, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = other[i] > acc[i] ? other[i] : acc[i];
}

template <typename T>
void Typed(void* acc, const void* other, int64_t n, ReduceOp op) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(other);
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: SumInto(a, b, n); return;
    case ReduceOp::kProduct: ProductInto(a, b, n); return;
    case ReduceOp::kMin: MinInto(a, b, n); return;
    case ReduceOp::kMax: MaxInto(a, b, n); return;
    case ReduceOp::kAdasum: return;
  }
}

}  // namespace

void ReduceInto(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: Typed<uint8_t>(acc, other, count, op); return;
    case DataType::kInt8: Typed<int8_t>(acc, other, count, op); return;
    case DataType::kInt16: Typed<int16_t>(acc, other, count, op); return;
    case DataType::kInt32: Typed<int32_t>(acc, other, count, op); return;
    case DataType::kInt64: Typed<int64_t>(acc, other, count, op); return;
    case DataType::kFloat32: Typed<float>(acc, other, count, op); return;
    case DataType::kFloat64: Typed<double>(acc, other, count, op); return;
    case DataType::kBool: {
      // 0/1 bytes: or-like ops are max, and-like ops are min.
      const bool and_like = op == ReduceOp::kMin || op == ReduceOp::kProduct;
      Typed<uint8_t>(acc, other, count, and_like ? ReduceOp::kMin : ReduceOp::kMax);
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: return;  // widened by the caller
  }
}

}  // namespace hora
