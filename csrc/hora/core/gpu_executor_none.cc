// A CPU-only build: GPU tensors are refused before they reach the engine,
// so this only explains what is missing.
#include "hora/core/gpu_executor.h"
#include "hora/cuda/device_runtime.h"

namespace hora {

Status CreateGpuExecutor(Communicator*, const GpuOptions&, int, CollectivePath*,
                         std::unique_ptr<GpuExecutor>*) {
  return gpu::NotBuilt();
}

}  // namespace hora
