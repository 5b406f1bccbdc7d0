#include "errors.h"

namespace py = pybind11;

namespace hora {
namespace {

const char* ExceptionClassName(StatusCode code) {
  switch (code) {
    case StatusCode::kMismatch: return "HoraMismatchError";
    case StatusCode::kInternal: return "HoraInternalError";
    case StatusCode::kTimeout: return "HoraTimeoutError";
    case StatusCode::kShutdown: return "HoraShutdownError";
    case StatusCode::kInvalidArgument: return "HoraInvalidArgumentError";
    case StatusCode::kTypeError: return "HoraTypeError";
    default: return "HoraError";
  }
}

[[noreturn]] void Throw(const char* class_name, const std::string& message) {
  py::object cls = py::module_::import("hora.common.exceptions").attr(class_name);
  PyErr_SetString(cls.ptr(), message.c_str());
  throw py::error_already_set();
}

}  // namespace

void ThrowStatus(const Status& status) {
  Throw(ExceptionClassName(status.code()), status.message());
}

void ThrowValueError(const std::string& message) { Throw("HoraInvalidArgumentError", message); }
void ThrowTypeError(const std::string& message) { Throw("HoraTypeError", message); }

}  // namespace hora
