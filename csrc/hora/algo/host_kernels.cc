#include "hora/algo/host_kernels.h"

#include <cstring>
#include <limits>
#include <vector>

#include "hora/algo/kernels/kernel_set.h"

namespace hora {
namespace {

template <typename T>
void DivideTyped(void* buf, int64_t count, int64_t divisor) {
  // In 64 bits: the divisor (a rank count) may not fit in T.
  T* b = static_cast<T*>(buf);
  for (int64_t i = 0; i < count; ++i) b[i] = static_cast<T>(static_cast<int64_t>(b[i]) / divisor);
}

template <typename T>
void FillTyped(void* buf, int64_t count, ReduceOp op) {
  T value;
  switch (op) {
    case ReduceOp::kProduct: value = T(1); break;
    case ReduceOp::kMin:
      value = std::numeric_limits<T>::has_infinity ? std::numeric_limits<T>::infinity()
                                                   : std::numeric_limits<T>::max();
      break;
    case ReduceOp::kMax:
      value = std::numeric_limits<T>::has_infinity ? -std::numeric_limits<T>::infinity()
                                                   : std::numeric_limits<T>::lowest();
      break;
    default: value = T(0); break;
  }
  T* b = static_cast<T*>(buf);
  for (int64_t i = 0; i < count; ++i) b[i] = value;
}

}  // namespace

void ScaleCopy(const void* src, void* dst, int64_t count, DataType dtype, double factor) {
  Kernels().scale_copy(src, dst, count, dtype, factor);
}

void DivideInPlace(void* buf, int64_t count, DataType dtype, int64_t divisor) {
  switch (dtype) {
    case DataType::kUInt8: DivideTyped<uint8_t>(buf, count, divisor); return;
    case DataType::kInt8: DivideTyped<int8_t>(buf, count, divisor); return;
    case DataType::kInt16: DivideTyped<int16_t>(buf, count, divisor); return;
    case DataType::kUInt16: DivideTyped<uint16_t>(buf, count, divisor); return;
    case DataType::kInt32: DivideTyped<int32_t>(buf, count, divisor); return;
    case DataType::kInt64: DivideTyped<int64_t>(buf, count, divisor); return;
    default: ScaleCopy(buf, buf, count, dtype, 1.0 / static_cast<double>(divisor)); return;
  }
}

void FillNeutral(void* buf, int64_t count, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: FillTyped<uint8_t>(buf, count, op); return;
    case DataType::kInt8: FillTyped<int8_t>(buf, count, op); return;
    case DataType::kInt16: FillTyped<int16_t>(buf, count, op); return;
    case DataType::kUInt16: FillTyped<uint16_t>(buf, count, op); return;
    case DataType::kInt32: FillTyped<int32_t>(buf, count, op); return;
    case DataType::kInt64: FillTyped<int64_t>(buf, count, op); return;
    case DataType::kFloat32: FillTyped<float>(buf, count, op); return;
    case DataType::kFloat64: FillTyped<double>(buf, count, op); return;
    case DataType::kBool: {
      // or-like ops (Sum, Max) are neutral on false; and-like ops on true
      const bool and_like = op == ReduceOp::kMin || op == ReduceOp::kProduct;
      std::memset(buf, and_like ? 1 : 0, count);
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      std::vector<float> staging(static_cast<size_t>(count));
      FillTyped<float>(staging.data(), count, op);
      NarrowFromFloat(staging.data(), buf, count, dtype, 1.0);
      return;
    }
  }
}

void WidenToFloat(const void* src, float* dst, int64_t count, DataType dtype, double factor) {
  Kernels().widen(src, dst, count, dtype, factor);
}

void NarrowFromFloat(const float* src, void* dst, int64_t count, DataType dtype, double factor) {
  Kernels().narrow(src, dst, count, dtype, factor);
}

}  // namespace hora
