#include "tensor_arg.h"

#include <cstring>

#include "errors.h"
#include "hora/common/dtype.h"
#include "hora/cuda/device_runtime.h"

namespace py = pybind11;

namespace hora {
namespace {

bool DtypeFromFormat(const char* format, Py_ssize_t itemsize, DataType* out) {
  while (*format == '<' || *format == '=' || *format == '@' || *format == '|') ++format;
  if (format[0] == '\0' || format[1] != '\0') return false;
  switch (format[0]) {
    case '?': *out = DataType::kBool; return true;
    case 'b': *out = DataType::kInt8; return true;
    case 'B': *out = DataType::kUInt8; return true;
    case 'e': *out = DataType::kFloat16; return true;
    case 'f': *out = DataType::kFloat32; return true;
    case 'd': *out = DataType::kFloat64; return true;
    case 'H':
      if (itemsize != 2) return false;
      *out = DataType::kUInt16;
      return true;
    case 'h':
    case 'i':
    case 'l':
    case 'q':
      switch (itemsize) {
        case 2: *out = DataType::kInt16; return true;
        case 4: *out = DataType::kInt32; return true;
        case 8: *out = DataType::kInt64; return true;
      }
      return false;
    default: return false;
  }
}

bool DtypeFromDlpack(const dlpack::DataType& t, DataType* out) {
  if (t.lanes != 1) return false;
  switch (t.code) {
    case dlpack::kInt:
      switch (t.bits) {
        case 8: *out = DataType::kInt8; return true;
        case 16: *out = DataType::kInt16; return true;
        case 32: *out = DataType::kInt32; return true;
        case 64: *out = DataType::kInt64; return true;
      }
      return false;
    case dlpack::kUInt:
      switch (t.bits) {
        case 8: *out = DataType::kUInt8; return true;
        case 16: *out = DataType::kUInt16; return true;
      }
      return false;
    case dlpack::kFloat:
      switch (t.bits) {
        case 16: *out = DataType::kFloat16; return true;
        case 32: *out = DataType::kFloat32; return true;
        case 64: *out = DataType::kFloat64; return true;
      }
      return false;
    case dlpack::kBfloat:
      if (t.bits == 16) {
        *out = DataType::kBFloat16;
        return true;
      }
      return false;
    case dlpack::kBool:
      if (t.bits == 8) {
        *out = DataType::kBool;
        return true;
      }
      return false;
  }
  return false;
}

// NumPy-style type strings ("<f4") as __cuda_array_interface__ gives them.
bool DtypeFromTypestr(const std::string& typestr, DataType* out) {
  if (typestr.size() < 3 || typestr[0] == '>') return false;
  const char kind = typestr[1];
  const int bytes = std::atoi(typestr.c_str() + 2);
  switch (kind) {
    case 'b':
      if (bytes == 1) {
        *out = DataType::kBool;
        return true;
      }
      return false;
    case 'u':
      switch (bytes) {
        case 1: *out = DataType::kUInt8; return true;
        case 2: *out = DataType::kUInt16; return true;
      }
      return false;
    case 'i':
      switch (bytes) {
        case 1: *out = DataType::kInt8; return true;
        case 2: *out = DataType::kInt16; return true;
        case 4: *out = DataType::kInt32; return true;
        case 8: *out = DataType::kInt64; return true;
      }
      return false;
    case 'f':
      switch (bytes) {
        case 2: *out = DataType::kFloat16; return true;
        case 4: *out = DataType::kFloat32; return true;
        case 8: *out = DataType::kFloat64; return true;
      }
      return false;
  }
  return false;
}

const char* kNoGpu =
    " lives on a GPU, but this build of hora has no GPU support: rebuild it with "
    "HORA_WITH_CUDA=1 (see `horarun --check-build`), or pass host memory";

const char* kSupported =
    "supported types are uint8, int8, int16, int32, int64, float16, bfloat16, float32, "
    "float64 and bool";

}  // namespace

TensorArg::TensorArg(py::handle object, bool writable, int dtype_override, const ArgName& what,
                     bool caller_orders) {
  try {
    if (!FromBuffer(object, writable, what) && !FromCudaArrayInterface(object, writable, what)) {
      FromDlpack(object, what, caller_orders);
    }
    if (dtype_override >= 0) {
      const DataType requested = static_cast<DataType>(dtype_override);
      if (DataTypeSize(requested) != DataTypeSize(view_.dtype)) {
        ThrowTypeError(what.str() + ": cannot reinterpret " + DataTypeName(view_.dtype) + " as " +
                       DataTypeName(requested));
      }
      view_.dtype = requested;
    }
  } catch (...) {
    Release();  // the destructor does not run when the constructor throws
    throw;
  }
}

TensorArg::TensorArg(py::handle owner, uintptr_t data, std::vector<int64_t> shape, DataType dtype) {
  view_.data = reinterpret_cast<void*>(data);
  view_.shape = std::move(shape);
  view_.dtype = dtype;
  keep_alive_ = py::reinterpret_borrow<py::object>(owner);
}

TensorArg::TensorArg(TensorArg&& other) noexcept
    : view_(std::move(other.view_)),
      buffer_(other.buffer_),
      has_buffer_(other.has_buffer_),
      managed_(other.managed_),
      keep_alive_(std::move(other.keep_alive_)) {
  other.has_buffer_ = false;
  other.managed_ = nullptr;
}

TensorArg::~TensorArg() { Release(); }

void TensorArg::Release() {
  if (has_buffer_) PyBuffer_Release(&buffer_);
  has_buffer_ = false;
  if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  managed_ = nullptr;
  keep_alive_ = py::object();
}

bool TensorArg::FromCudaArrayInterface(py::handle object, bool writable, const ArgName& what) {
  // DLPack is preferred where both exist: its capsule keeps the memory alive
  // and says which device holds it.
  if (py::hasattr(object, "__dlpack__") || !py::hasattr(object, "__cuda_array_interface__")) {
    return false;
  }
  if (!gpu::BuiltIn()) ThrowValueError(what.str() + kNoGpu);
  py::dict cai = object.attr("__cuda_array_interface__");
  py::tuple data = cai["data"];
  if (writable && data[1].cast<bool>()) {
    ThrowValueError(what.str() + " is read-only, but this collective writes its result into it");
  }
  const std::string typestr = cai["typestr"].cast<std::string>();
  if (!DtypeFromTypestr(typestr, &view_.dtype)) {
    ThrowTypeError(what.str() + " has unsupported element type '" + typestr + "'; " + kSupported);
  }
  view_.shape = cai["shape"].cast<std::vector<int64_t>>();
  if (cai.contains("strides") && !cai["strides"].is_none() && view_.NumElements() != 0) {
    const std::vector<int64_t> strides = cai["strides"].cast<std::vector<int64_t>>();
    int64_t expected = DataTypeSize(view_.dtype);
    for (int d = static_cast<int>(view_.shape.size()) - 1; d >= 0; --d) {
      if (view_.shape[d] != 1 && strides[d] != expected) {
        ThrowValueError(what.str() + " is not contiguous; pass a contiguous copy");
      }
      expected *= view_.shape[d];
    }
  }
  view_.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  view_.device = 0;
  if (view_.data != nullptr) {
    Status status = gpu::PointerDevice(view_.data, &view_.device);
    if (!status.ok()) ThrowValueError(what.str() + ": " + status.message());
  }
  keep_alive_ = py::reinterpret_borrow<py::object>(object);
  return true;
}

bool TensorArg::FromBuffer(py::handle object, bool writable, const ArgName& what) {
  if (!PyObject_CheckBuffer(object.ptr())) return false;
  if (PyObject_GetBuffer(object.ptr(), &buffer_, PyBUF_RECORDS_RO) != 0) {
    PyErr_Clear();
    return false;
  }
  has_buffer_ = true;
  const Py_buffer& b = buffer_;
  if (writable && b.readonly) {
    ThrowValueError(what.str() + " is read-only, but this collective writes its result into it");
  }
  if (!DtypeFromFormat(b.format == nullptr ? "B" : b.format, b.itemsize, &view_.dtype)) {
    ThrowTypeError(what.str() + " has unsupported element format '" +
                   std::string(b.format == nullptr ? "B" : b.format) + "'; " + kSupported);
  }
  if (!PyBuffer_IsContiguous(&b, 'C')) {
    ThrowValueError(what.str() +
                    " is not contiguous; pass a contiguous copy (e.g. numpy.ascontiguousarray)");
  }
  view_.data = b.buf;
  view_.shape.assign(b.shape, b.shape + b.ndim);
  return true;
}

void TensorArg::FromDlpack(py::handle object, const ArgName& what, bool caller_orders) {
  if (!py::hasattr(object, "__dlpack__")) {
    ThrowTypeError(what.str() + ": expected an array (buffer protocol or __dlpack__), got " +
                   std::string(py::str(py::type::of(object).attr("__name__"))));
  }
  // Stream -1 is DLPack's "do not synchronize": hora orders its own work.
  py::object capsule = caller_orders ? object.attr("__dlpack__")(py::arg("stream") = -1)
                                     : object.attr("__dlpack__")();
  void* pointer = PyCapsule_GetPointer(capsule.ptr(), "dltensor");
  if (pointer == nullptr) throw py::error_already_set();
  managed_ = static_cast<dlpack::ManagedTensor*>(pointer);
  // Renaming marks the capsule consumed: we now own the deleter call.
  PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  const dlpack::Tensor& t = managed_->dl_tensor;
  const bool on_gpu =
      t.device.device_type == dlpack::kCUDA || t.device.device_type == dlpack::kCUDAManaged;
  if (on_gpu && !gpu::BuiltIn()) ThrowValueError(what.str() + kNoGpu);
  if (!on_gpu && t.device.device_type != dlpack::kCPU &&
      t.device.device_type != dlpack::kCUDAHost) {
    ThrowValueError(what.str() + " lives on an unsupported device (DLPack device type " +
                    std::to_string(t.device.device_type) +
                    "); hora handles host memory and CUDA GPUs");
  }
  view_.device = on_gpu ? t.device.device_id : -1;
  if (!DtypeFromDlpack(t.dtype, &view_.dtype)) {
    ThrowTypeError(what.str() + " has an unsupported element type (DLPack code " +
                   std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) + " bits); " +
                   kSupported);
  }
  view_.shape.assign(t.shape, t.shape + t.ndim);
  // Strides mean nothing for a tensor without elements.
  if (t.strides != nullptr && view_.NumElements() != 0) {
    int64_t expected = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      if (t.shape[d] != 1 && t.strides[d] != expected) {
        ThrowValueError(what.str() + " is not contiguous; call .contiguous() first");
      }
      expected *= t.shape[d];
    }
  }
  view_.data = static_cast<char*>(t.data) + t.byte_offset;
}

}  // namespace hora
