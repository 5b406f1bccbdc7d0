// hora._C: the one compiled module. It serves every framework, because the
// core sees only raw array views; the framework adapters are pure Python.
#include <pybind11/pybind11.h>

#include "hora/common/build_config.h"
#include "hora/common/collective.h"
#include "hora/common/dtype.h"
#include "runtime.h"

namespace py = pybind11;

namespace hora {
void RegisterOps(py::module_& m);
void RegisterSimulation(py::module_& m);
#if HORA_HAVE_CUDA
void RegisterGpuKernels(py::module_& m);
#endif
}  // namespace hora

PYBIND11_MODULE(_C, m) {
  m.doc() = "hora's framework-free core (private; use the hora package)";
  hora::RegisterRuntime(m);
  hora::RegisterOps(m);
  hora::RegisterSimulation(m);
#if HORA_HAVE_CUDA
  hora::RegisterGpuKernels(m);
#endif
  py::dict dtypes;
  for (int i = 0; i < hora::kNumDataTypes; ++i) {
    dtypes[hora::DataTypeName(static_cast<hora::DataType>(i))] = i;
  }
  m.attr("DTYPES") = dtypes;
  // The numbers Python passes for kinds and ops come from here, so the
  // Python side never copies them by hand.
  py::dict kinds;
  for (int i = 0; i <= static_cast<int>(hora::CollectiveKind::kBarrier); ++i) {
    kinds[hora::CollectiveKindName(static_cast<hora::CollectiveKind>(i))] = i;
  }
  m.attr("COLLECTIVE_KINDS") = kinds;
  py::dict ops;
  for (int i = 0; i < hora::kNumReduceOps; ++i) {
    ops[hora::ReduceOpName(static_cast<hora::ReduceOp>(i))] = i;
  }
  m.attr("REDUCE_OPS") = ops;
}
