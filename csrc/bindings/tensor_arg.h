#pragma once
// Turns whatever array a caller passes (NumPy, anything with the buffer
// protocol, anything with __dlpack__ such as torch tensors) into a
// TensorView, and keeps the exporter's memory alive until the collective
// that reads or writes it has completed.
#include <pybind11/pybind11.h>

#include <memory>
#include <vector>

#include "dlpack.h"
#include "hora/core/tensor.h"

namespace hora {

// Names an argument in error messages ("tensor 'w1'"); the text is built only
// when an error needs it, not on every submission.
struct ArgName {
  const char* before;
  const std::string& name;
  const char* after;
  std::string str() const { return before + name + after; }
};

class TensorArg {
 public:
  // `what` names the argument in error messages.
  // `dtype_override` >= 0 reinterprets the elements (bfloat16 arrives as a
  // uint16 view from NumPy, which has no bfloat16 of its own).
  // `caller_orders`: the caller gave the CUDA stream that produces GPU
  // tensors, and hora orders its work after it, so a DLPack export is asked
  // not to synchronize (stream -1): for PyTorch that saves the stream
  // lookups, and an event, on every tensor.
  TensorArg(pybind11::handle object, bool writable, int dtype_override, const ArgName& what,
            bool caller_orders = false);
  // Contiguous host memory the caller describes itself (a torch CPU tensor's
  // data_ptr, shape and dtype, which cost far less to read than a DLPack
  // export); `owner` is kept alive until the collective has completed.
  TensorArg(pybind11::handle owner, uintptr_t data, std::vector<int64_t> shape, DataType dtype);
  ~TensorArg();
  // Moves the references to the caller's memory (a dropped handle's views
  // outlive its Python object until the engine is done with them).
  TensorArg(TensorArg&& other) noexcept;
  TensorArg(const TensorArg&) = delete;
  TensorArg& operator=(const TensorArg&) = delete;

  const TensorView& view() const { return view_; }

 private:
  bool FromBuffer(pybind11::handle object, bool writable, const ArgName& what);
  void FromDlpack(pybind11::handle object, const ArgName& what, bool caller_orders);
  // Objects that only describe GPU memory (numba, some CuPy versions).
  bool FromCudaArrayInterface(pybind11::handle object, bool writable, const ArgName& what);
  void Release();

  TensorView view_;
  Py_buffer buffer_{};  // held while has_buffer_
  bool has_buffer_ = false;
  dlpack::ManagedTensor* managed_ = nullptr;
  pybind11::object keep_alive_;  // the exporter of __cuda_array_interface__ memory
};

}  // namespace hora
