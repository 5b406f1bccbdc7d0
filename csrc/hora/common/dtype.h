#pragma once
// Element types the core understands. The numeric values are part of the
// wire format between ranks (they travel inside serialized requests), so they
// never change meaning; new types are appended.
#include <cstdint>
#include <string>

namespace hora {

enum class DataType : uint8_t {
  kUInt8 = 0,
  kInt8 = 1,
  kInt16 = 2,
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kBFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBool = 9,
  kUInt16 = 10,
};
constexpr int kNumDataTypes = 11;

int64_t DataTypeSize(DataType dtype);
const char* DataTypeName(DataType dtype);
bool IsFloatingPoint(DataType dtype);
bool IsValidDataType(int value);

}  // namespace hora
