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

class TensorArg {
 public:
  // `what` names the argument in error messages ("tensor 'w1'").
  // `dtype_override` >= 0 reinterprets the elements (bfloat16 arrives as a
  // uint16 view from NumPy, which has no bfloat16 of its own).
  TensorArg(pybind11::handle object, bool writable, int dtype_override, const std::string& what);
  ~TensorArg();
  TensorArg(const TensorArg&) = delete;
  TensorArg& operator=(const TensorArg&) = delete;

  const TensorView& view() const { return view_; }

 private:
  bool FromBuffer(pybind11::handle object, bool writable, const std::string& what);
  void FromDlpack(pybind11::handle object, const std::string& what);
  void Release();

  TensorView view_;
  std::unique_ptr<Py_buffer> buffer_;
  dlpack::ManagedTensor* managed_ = nullptr;
};

}  // namespace hora
