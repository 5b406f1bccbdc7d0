// The CUDA kernels exposed on their own, for their tests (against CPU
// references) and for `python -m hora.bench gpu-kernels`. Pointers are raw
// device addresses (torch's data_ptr()); streams are raw cudaStream_t values.
// Compiled only into CUDA builds.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <tuple>
#include <vector>

#include "errors.h"
#include "hora/cuda/cuda_status.h"
#include "hora/cuda/gpu_kernels.h"

namespace py = pybind11;

namespace hora {
namespace {

cudaStream_t Stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }

void Check(cudaError_t error, const char* what) {
  Status status = gpu::CudaStatus(error, what);
  if (!status.ok()) ThrowStatus(status);
}

DataType Dtype(int value) {
  if (!IsValidDataType(value)) ThrowValueError("unknown dtype code " + std::to_string(value));
  return static_cast<DataType>(value);
}

}  // namespace

void RegisterGpuKernels(py::module_& m) {
  m.def(
      "gpu_scaled_copy",
      [](const std::vector<std::tuple<uintptr_t, uintptr_t, int64_t>>& tasks, int in_dtype,
         int out_dtype, double scale, int64_t divisor, uintptr_t stream) {
        std::vector<gpu::CopyTask> list;
        for (const auto& t : tasks) {
          list.push_back(gpu::CopyTask{reinterpret_cast<const void*>(std::get<0>(t)),
                                       reinterpret_cast<void*>(std::get<1>(t)), std::get<2>(t)});
        }
        Check(gpu::ScaledCopy(list.data(), static_cast<int>(list.size()), Dtype(in_dtype),
                              Dtype(out_dtype), scale, divisor, Stream(stream)),
              "gpu_scaled_copy");
      },
      py::arg("tasks"), py::arg("in_dtype"), py::arg("out_dtype"), py::arg("scale") = 1.0,
      py::arg("divisor") = 1, py::arg("stream") = 0);
  m.def(
      "gpu_fill",
      [](uintptr_t dst, int64_t count, int element_bytes, uint64_t pattern, uintptr_t stream) {
        Check(
            gpu::Fill(reinterpret_cast<void*>(dst), count, element_bytes, pattern, Stream(stream)),
            "gpu_fill");
      },
      py::arg("dst"), py::arg("count"), py::arg("element_bytes"), py::arg("pattern"),
      py::arg("stream") = 0);
  // The reference the benchmark compares the kernels with.
  m.def(
      "gpu_memcpy",
      [](uintptr_t dst, uintptr_t src, int64_t bytes, uintptr_t stream) {
        Check(cudaMemcpyAsync(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src),
                              bytes, cudaMemcpyDeviceToDevice, Stream(stream)),
              "cudaMemcpyAsync");
      },
      py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("stream") = 0);
}

}  // namespace hora
