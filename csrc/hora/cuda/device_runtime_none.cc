// The GPU entry points of a CPU-only build: GPU tensors are refused before
// they reach the engine (the framework adapters stage them through host
// memory instead), so these only explain what is missing.
#include "hora/cuda/device_runtime.h"

namespace hora {
namespace gpu {

Status NotBuilt() {
  return Status::InvalidArgument(
      "this build of hora has no GPU support; rebuild with HORA_WITH_CUDA=1 "
      "(see `horarun --check-build`), or pass host tensors");
}

bool BuiltIn() { return false; }

Status DefaultDevice(int, int*) { return NotBuilt(); }

Status RecordReady(int, uintptr_t, std::shared_ptr<void>*) { return NotBuilt(); }

Status PointerDevice(const void*, int*) { return NotBuilt(); }

std::map<std::string, std::string> VersionInfo() { return {}; }

}  // namespace gpu
}  // namespace hora
