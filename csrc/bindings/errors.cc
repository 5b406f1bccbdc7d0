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
    default: return "HoraError";
  }
}

}  // namespace

void ThrowStatus(const Status& status) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument: throw py::value_error(status.message());
    case StatusCode::kTypeError: throw py::type_error(status.message());
    default: break;
  }
  py::object cls =
      py::module_::import("hora.common.exceptions").attr(ExceptionClassName(status.code()));
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw py::error_already_set();
}

void ThrowValueError(const std::string& message) { throw py::value_error(message); }
void ThrowTypeError(const std::string& message) { throw py::type_error(message); }

}  // namespace hora
