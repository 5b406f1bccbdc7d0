#pragma once
// The element-wise loops every allreduce path runs on host memory, compiled
// once per instruction set (generic, AVX2+F16C, AVX-512) and chosen at run
// time from what the CPU reports, so one wheel runs everywhere and still
// uses the widest vectors the machine has.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hora/common/dtype.h"
#include "hora/common/status.h"
#include "hora/common/collective.h"

namespace hora {

struct KernelSet {
  const char* name;
  // acc[i] = acc[i] (op) other[i]; half types are not handled here (they
  // are widened to float32 first).
  void (*reduce_into)(void* acc, const void* other, int64_t count, DataType dtype, ReduceOp op);
  // dst[i] = src[i] * factor for floating types (any dtype; src may equal dst).
  void (*scale_copy)(const void* src, void* dst, int64_t count, DataType dtype, double factor);
  // float16/bfloat16 -> float32 times factor, and back.
  void (*widen)(const void* src, float* dst, int64_t count, DataType dtype, double factor);
  void (*narrow)(const float* src, void* dst, int64_t count, DataType dtype, double factor);
  // memcpy whose stores bypass the cache: for data another core reads next,
  // so the reader fetches it from memory instead of from this core's cache.
  void (*stream_copy)(void* dst, const void* src, int64_t bytes);
};

// The set in use (the best one the CPU supports unless SelectKernels chose).
const KernelSet& Kernels();
// "auto", "generic", "avx2" or "avx512"; an error names what this CPU lacks.
Status SelectKernels(const std::string& name);
// Every kernel set compiled in, each with whether this CPU can run it.
std::vector<std::pair<std::string, bool>> KernelAvailability();

namespace kernels_generic {
extern const KernelSet kSet;
}
#if defined(__x86_64__)
namespace kernels_avx2 {
extern const KernelSet kSet;
}
namespace kernels_avx512 {
extern const KernelSet kSet;
}
#endif

}  // namespace hora
