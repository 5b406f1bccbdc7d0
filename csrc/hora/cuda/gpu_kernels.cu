#include "hora/cuda/gpu_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace hora {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocksPerTask = 1024;

struct TaskBatch {
  CopyTask tasks[kMaxTasksPerLaunch];
};

// Storage types, with a float (or double) view for the arithmetic.
struct F16 {
  __half v;
};
struct BF16 {
  __nv_bfloat16 v;
};

template <typename T>
struct Traits {  // integers and bool
  using Compute = T;
  static constexpr bool kFloat = false;
  __device__ static Compute Load(T x) { return x; }
  __device__ static T Store(Compute x) { return x; }
};
template <>
struct Traits<F16> {
  using Compute = float;
  static constexpr bool kFloat = true;
  __device__ static float Load(F16 x) { return __half2float(x.v); }
  __device__ static F16 Store(float x) { return F16{__float2half_rn(x)}; }
};
template <>
struct Traits<BF16> {
  using Compute = float;
  static constexpr bool kFloat = true;
  __device__ static float Load(BF16 x) { return __bfloat162float(x.v); }
  __device__ static BF16 Store(float x) { return BF16{__float2bfloat16_rn(x)}; }
};
template <>
struct Traits<float> {
  using Compute = float;
  static constexpr bool kFloat = true;
  __device__ static float Load(float x) { return x; }
  __device__ static float Store(float x) { return x; }
};
template <>
struct Traits<double> {
  using Compute = double;
  static constexpr bool kFloat = true;
  __device__ static double Load(double x) { return x; }
  __device__ static double Store(double x) { return x; }
};

// One element: loaded, scaled (or, for integers, divided), stored.
template <typename In, typename Out>
__device__ __forceinline__ Out Convert(In x, double scale, int64_t divisor) {
  if constexpr (Traits<In>::kFloat) {
    using C = typename Traits<In>::Compute;
    const C v = Traits<In>::Load(x) * static_cast<C>(scale);
    return Traits<Out>::Store(static_cast<typename Traits<Out>::Compute>(v));
  } else {
    if (scale != 1.0) return static_cast<Out>(static_cast<double>(x) * scale);
    return static_cast<Out>(static_cast<int64_t>(x) / divisor);
  }
}

// kVec consecutive elements, moved as one access of up to 16 bytes (two
// for 32 bytes).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec < 16 ? sizeof(T) * kVec : 16) Chunk {
  T v[kVec];
};

// Elements per thread and access: 16 bytes of the wider of the two types.
template <typename In, typename Out>
struct VecOf {
  static constexpr int value = 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));
};

template <typename T, int kVec>
__device__ __forceinline__ bool Aligned(const void* p) {
  constexpr uintptr_t kAlign = alignof(Chunk<T, kVec>);
  return (reinterpret_cast<uintptr_t>(p) & (kAlign - 1)) == 0;
}

// blockIdx.y picks the task; the blocks along x stride over its elements,
// kVec at a time (16-byte loads and stores) when both pointers allow it.
template <typename In, typename Out>
__global__ void ScaledCopyKernel(TaskBatch batch, double scale, int64_t divisor) {
  constexpr int kVec = VecOf<In, Out>::value;
  const CopyTask task = batch.tasks[blockIdx.y];
  const In* src = static_cast<const In*>(task.src);
  Out* dst = static_cast<Out*>(task.dst);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (kVec > 1 && Aligned<In, kVec>(src) && Aligned<Out, kVec>(dst)) {
    const int64_t chunks = task.count / kVec;
    const auto* in = reinterpret_cast<const Chunk<In, kVec>*>(src);
    auto* out = reinterpret_cast<Chunk<Out, kVec>*>(dst);
    for (int64_t i = first; i < chunks; i += stride) {
      const Chunk<In, kVec> x = in[i];
      Chunk<Out, kVec> y;
#pragma unroll
      for (int k = 0; k < kVec; ++k) y.v[k] = Convert<In, Out>(x.v[k], scale, divisor);
      out[i] = y;
    }
    done = chunks * kVec;
  }
  for (int64_t i = done + first; i < task.count; i += stride) {
    dst[i] = Convert<In, Out>(src[i], scale, divisor);
  }
}

// Same-type copy of `count` bytes per task, 16 bytes per thread and access
// when source and destination are equally placed within 16 bytes (after a
// head of up to 15 single bytes), else 4 when they are within 4, else 1.
__global__ void CopyBytesKernel(TaskBatch batch) {
  const CopyTask task = batch.tasks[blockIdx.y];
  const char* src = static_cast<const char*>(task.src);
  char* dst = static_cast<char*>(task.dst);
  const int64_t bytes = task.count;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const uintptr_t s = reinterpret_cast<uintptr_t>(src);
  const uintptr_t apart = s ^ reinterpret_cast<uintptr_t>(dst);
  const int64_t width = (apart & 15) == 0 ? 16 : (apart & 3) == 0 ? 4 : 1;
  int64_t head = 0;
  if (width > 1) {
    head = static_cast<int64_t>((width - (s & (width - 1))) & (width - 1));
    if (head > bytes) head = bytes;
  }
  for (int64_t i = first; i < head; i += stride) dst[i] = src[i];
  const int64_t n = (bytes - head) / width;
  if (width == 16) {
    const uint4* in = reinterpret_cast<const uint4*>(src + head);
    uint4* out = reinterpret_cast<uint4*>(dst + head);
    for (int64_t i = first; i < n; i += stride) out[i] = in[i];
  } else if (width == 4) {
    const uint32_t* in = reinterpret_cast<const uint32_t*>(src + head);
    uint32_t* out = reinterpret_cast<uint32_t*>(dst + head);
    for (int64_t i = first; i < n; i += stride) out[i] = in[i];
  }
  const int64_t done = width > 1 ? head + n * width : 0;
  for (int64_t i = done + first; i < bytes; i += stride) dst[i] = src[i];
}

template <typename T>
__global__ void FillKernel(T* dst, int64_t count, T value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = value;
  }
}

int BlocksFor(int64_t work_items) {
  const int64_t blocks = (work_items + kThreads * 4 - 1) / (kThreads * 4);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, kMaxBlocksPerTask)));
}

// Launches `launch(batch, blocks_x, n)` once per kMaxTasksPerLaunch tasks;
// `work_of` gives a task's work items (elements or bytes).
template <typename Launch, typename WorkOf>
cudaError_t InBatches(const CopyTask* tasks, int num_tasks, Launch launch, WorkOf work_of) {
  for (int first = 0; first < num_tasks; first += kMaxTasksPerLaunch) {
    const int n = std::min(kMaxTasksPerLaunch, num_tasks - first);
    TaskBatch batch;
    int64_t most = 0;
    for (int k = 0; k < n; ++k) {
      batch.tasks[k] = tasks[first + k];
      most = std::max(most, work_of(tasks[first + k]));
    }
    if (most == 0) continue;
    launch(batch, BlocksFor(most), n);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  return cudaSuccess;
}

template <typename In, typename Out>
cudaError_t LaunchScaled(const CopyTask* tasks, int num_tasks, double scale, int64_t divisor,
                         cudaStream_t stream) {
  return InBatches(
      tasks, num_tasks,
      [&](const TaskBatch& batch, int blocks, int n) {
        ScaledCopyKernel<In, Out><<<dim3(blocks, n), kThreads, 0, stream>>>(batch, scale, divisor);
      },
      [](const CopyTask& t) { return t.count; });
}

template <typename T>
cudaError_t SameType(const CopyTask* tasks, int num_tasks, double scale, int64_t divisor,
                     cudaStream_t stream) {
  return LaunchScaled<T, T>(tasks, num_tasks, scale, divisor, stream);
}

}  // namespace

cudaError_t ScaledCopy(const CopyTask* tasks, int num_tasks, DataType in, DataType out,
                       double scale, int64_t divisor, cudaStream_t stream) {
  if (divisor < 1) return cudaErrorInvalidValue;
  const bool plain = in == out && scale == 1.0 && (IsFloatingPoint(in) || divisor == 1);
  if (plain) {
    const int64_t element = DataTypeSize(in);
    return InBatches(
        tasks, num_tasks,
        [&](TaskBatch batch, int blocks, int n) {
          for (int k = 0; k < n; ++k) batch.tasks[k].count *= element;
          CopyBytesKernel<<<dim3(blocks, n), kThreads, 0, stream>>>(batch);
        },
        [element](const CopyTask& t) { return (t.count * element + 15) / 16; });
  }
  if (in == out) {
    switch (in) {
      case DataType::kUInt8: return SameType<uint8_t>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kInt8: return SameType<int8_t>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kInt16: return SameType<int16_t>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kUInt16: return SameType<uint16_t>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kInt32: return SameType<int32_t>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kInt64: return SameType<int64_t>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kFloat16: return SameType<F16>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kBFloat16: return SameType<BF16>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kFloat32: return SameType<float>(tasks, num_tasks, scale, divisor, stream);
      case DataType::kFloat64: return SameType<double>(tasks, num_tasks, scale, divisor, stream);
      default: return cudaErrorInvalidValue;  // bool has nothing to scale
    }
  }
  using D = DataType;
  if (in == D::kInt16 && out == D::kInt32)
    return LaunchScaled<int16_t, int32_t>(tasks, num_tasks, scale, divisor, stream);
  if (in == D::kInt32 && out == D::kInt16)
    return LaunchScaled<int32_t, int16_t>(tasks, num_tasks, scale, divisor, stream);
  if (in == D::kUInt16 && out == D::kInt32)
    return LaunchScaled<uint16_t, int32_t>(tasks, num_tasks, scale, divisor, stream);
  if (in == D::kInt32 && out == D::kUInt16)
    return LaunchScaled<int32_t, uint16_t>(tasks, num_tasks, scale, divisor, stream);
  if (in == D::kFloat16 && out == D::kFloat32)
    return LaunchScaled<F16, float>(tasks, num_tasks, scale, divisor, stream);
  if (in == D::kFloat32 && out == D::kFloat16)
    return LaunchScaled<float, F16>(tasks, num_tasks, scale, divisor, stream);
  if (in == D::kBFloat16 && out == D::kFloat32)
    return LaunchScaled<BF16, float>(tasks, num_tasks, scale, divisor, stream);
  if (in == D::kFloat32 && out == D::kBFloat16)
    return LaunchScaled<float, BF16>(tasks, num_tasks, scale, divisor, stream);
  return cudaErrorInvalidValue;
}

cudaError_t Fill(void* dst, int64_t count, int element_bytes, uint64_t pattern,
                 cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  const int blocks = BlocksFor(count);
  switch (element_bytes) {
    case 1:
      FillKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint8_t*>(dst), count,
                                                  static_cast<uint8_t>(pattern));
      break;
    case 2:
      FillKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint16_t*>(dst), count,
                                                  static_cast<uint16_t>(pattern));
      break;
    case 4:
      FillKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint32_t*>(dst), count,
                                                  static_cast<uint32_t>(pattern));
      break;
    case 8:
      FillKernel<<<blocks, kThreads, 0, stream>>>(static_cast<uint64_t*>(dst), count, pattern);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace hora
