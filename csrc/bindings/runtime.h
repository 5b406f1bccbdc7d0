#pragma once
#include <pybind11/pybind11.h>

#include <memory>

#include "hora/core/engine.h"

namespace hora {

// The running engine; raises ValueError naming the fix when hora is not
// initialized (or was shut down).
std::shared_ptr<Engine> CurrentEngine();
// The running engine's settings, or (before init, or in a process waiting
// to join an elastic world) the environment's, read now.
Config CurrentConfig();
void RegisterRuntime(pybind11::module_& m);

}  // namespace hora
