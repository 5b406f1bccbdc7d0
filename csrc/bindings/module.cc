// hora._C: the one compiled module. It serves every framework, because the
// core sees only raw array views; the framework adapters are pure Python.
#include <pybind11/pybind11.h>

#include "hora/common/build_config.h"
#include "hora/common/dtype.h"
#include "runtime.h"

namespace py = pybind11;

namespace hora {
void RegisterOps(py::module_& m);
#if HORA_HAVE_CUDA
void RegisterGpuKernels(py::module_& m);
#endif
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "hora's framework-free core (private; use the hora package)";
  hora::RegisterRuntime(m);
  hora::RegisterOps(m);
#if HORA_HAVE_CUDA
  hora::RegisterGpuKernels(m);
#endif
  py::dict dtypes;
  for (int i = 0; i < hora::kNumDataTypes; ++i) {
    dtypes[hora::DataTypeName(static_cast<hora::DataType>(i))] = i;
  }
  m.attr("DTYPES") = dtypes;
}
