#pragma once
// The CUDA kernels of the GPU path, callable from plain C++ (the NCCL
// backend, the kernel tests and the benchmark). Every function only queues
// work on `stream` and returns the launch error, if any.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "hora/common/dtype.h"

namespace hora {
namespace gpu {

// One tensor of a batch: `count` elements from `src` to `dst`.
struct CopyTask {
  const void* src;
  void* dst;
  int64_t count;
};
// Tasks per kernel launch (they travel as a kernel parameter); larger
// batches take one launch per this many tasks.
constexpr int kMaxTasksPerLaunch = 96;

// Converts every task's elements from `in` to `out` type: floating-point
// values are multiplied by `scale`, integers divided by `divisor` (an
// integer Average). Supported pairs: any type to itself, int16 <-> int32,
// float16 <-> float32, bfloat16 <-> float32. A plain copy (same type, scale
// 1, divisor 1) moves 16 bytes per thread where the pointers allow.
cudaError_t ScaledCopy(const CopyTask* tasks, int num_tasks, DataType in, DataType out,
                       double scale, int64_t divisor, cudaStream_t stream);
// Writes `count` elements of `element_bytes` (1, 2, 4 or 8) bytes, each
// equal to the low bytes of `pattern`.
cudaError_t Fill(void* dst, int64_t count, int element_bytes, uint64_t pattern,
                 cudaStream_t stream);

}  // namespace gpu
}  // namespace hora
