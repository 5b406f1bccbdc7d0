#include "hora/comm/reduce_into.h"

#include <string>

namespace hora {
namespace {

template <typename T>
void ReduceTyped(T* acc, const T* other, int64_t count, ReduceOp op) {
  for (int64_t i = 0; i < count; ++i) {
    switch (op) {
      // NaN wins, as in the engine's kernels.
      case ReduceOp::kMin:
        acc[i] = (other[i] < acc[i] || other[i] != other[i]) ? other[i] : acc[i];
        break;
      case ReduceOp::kMax:
        acc[i] = (other[i] > acc[i] || other[i] != other[i]) ? other[i] : acc[i];
        break;
      case ReduceOp::kProduct: acc[i] = static_cast<T>(acc[i] * other[i]); break;
      default: acc[i] = static_cast<T>(acc[i] + other[i]); break;  // Sum, Average
    }
  }
}

}  // namespace

Status ReduceInto(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op,
                  const char* transport) {
  switch (dtype) {
    case DataType::kUInt8:
      ReduceTyped(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(other), count, op);
      return Status::OK();
    case DataType::kInt8:
      ReduceTyped(static_cast<int8_t*>(acc), static_cast<const int8_t*>(other), count, op);
      return Status::OK();
    case DataType::kInt16:
      ReduceTyped(static_cast<int16_t*>(acc), static_cast<const int16_t*>(other), count, op);
      return Status::OK();
    case DataType::kUInt16:
      ReduceTyped(static_cast<uint16_t*>(acc), static_cast<const uint16_t*>(other), count, op);
      return Status::OK();
    case DataType::kInt32:
      ReduceTyped(static_cast<int32_t*>(acc), static_cast<const int32_t*>(other), count, op);
      return Status::OK();
    case DataType::kInt64:
      ReduceTyped(static_cast<int64_t*>(acc), static_cast<const int64_t*>(other), count, op);
      return Status::OK();
    case DataType::kFloat32:
      ReduceTyped(static_cast<float*>(acc), static_cast<const float*>(other), count, op);
      return Status::OK();
    case DataType::kFloat64:
      ReduceTyped(static_cast<double*>(acc), static_cast<const double*>(other), count, op);
      return Status::OK();
    case DataType::kBool: {
      // 0/1 bytes: or-like ops are max, and-like ops are min.
      const bool and_like = op == ReduceOp::kMin || op == ReduceOp::kProduct;
      ReduceTyped(static_cast<uint8_t*>(acc), static_cast<const uint8_t*>(other), count,
                  and_like ? ReduceOp::kMin : ReduceOp::kMax);
      return Status::OK();
    }
    default:
      return Status::InvalidArgument(std::string(transport) + ": no reduction for " +
                                     DataTypeName(dtype) + " (half types are widened first)");
  }
}

}  // namespace hora
