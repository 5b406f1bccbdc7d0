#pragma once
// The one place where a core Status becomes a Python exception.
#include <pybind11/pybind11.h>

#include "hora/common/status.h"

namespace hora {

// Raises the Python exception matching status.code(): ValueError, TypeError,
// or one of hora's own classes from hora.common.exceptions.
[[noreturn]] void ThrowStatus(const Status& status);
// Shorthands for argument errors found at the call site.
[[noreturn]] void ThrowValueError(const std::string& message);
[[noreturn]] void ThrowTypeError(const std::string& message);

}  // namespace hora
