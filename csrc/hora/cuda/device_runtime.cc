// The process-wide GPU helpers of a CUDA build: the pool of ready events
// that submissions record, device lookups and CUDA version reporting.
#include <cuda_runtime_api.h>

#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "hora/common/build_config.h"
#include "hora/cuda/cuda_status.h"
#include "hora/cuda/device_runtime.h"

namespace hora {
namespace gpu {
namespace {

std::string VersionString(int code, int major_div, int minor_div, int minor_mod) {
  return std::to_string(code / major_div) + "." + std::to_string(code / minor_div % minor_mod);
}

// Events are tied to the device current when they were created, so the
// pool keeps one free list per device. Submissions take one per GPU tensor;
// the engine gives it back once its stream has been told to wait on it.
class EventPool {
 public:
  Status Take(int device, cudaEvent_t* out) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<cudaEvent_t>& free = free_[device];
      if (!free.empty()) {
        *out = free.back();
        free.pop_back();
        return Status::OK();
      }
    }
    return CudaStatus(cudaEventCreateWithFlags(out, cudaEventDisableTiming), "cudaEventCreate");
  }
  void Give(int device, cudaEvent_t event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(event);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<int, std::vector<cudaEvent_t>> free_;
};

// The one GPU this process uses for hora's collectives: NCCL binds a
// communicator to one device, so the first GPU tensor decides.
std::atomic<int> g_device{-1};

EventPool& Pool() {
  static EventPool* pool = new EventPool();  // never destroyed: used at exit
  return *pool;
}

}  // namespace

bool BuiltIn() { return true; }

Status RecordReady(int device, uintptr_t stream, std::shared_ptr<void>* event) {
  int expected = -1;
  if (!g_device.compare_exchange_strong(expected, device) && expected != device) {
    return Status::InvalidArgument(
        "is on GPU " + std::to_string(device) + ", but this process already uses GPU " +
        std::to_string(expected) +
        " for hora's collectives; keep each rank's tensors on one GPU "
        "(e.g. torch.cuda.set_device(hvd.local_rank()) before creating them)");
  }
  DeviceGuard guard(device);
  cudaEvent_t e;
  HORA_RETURN_IF_ERROR(Pool().Take(device, &e));
  const cudaError_t error = cudaEventRecord(e, reinterpret_cast<cudaStream_t>(stream));
  if (error != cudaSuccess) {
    Pool().Give(device, e);
    cudaGetLastError();
    return CudaStatus(error, "cudaEventRecord on the caller's stream");
  }
  *event = std::shared_ptr<void>(
      e, [device](void* p) { Pool().Give(device, static_cast<cudaEvent_t>(p)); });
  return Status::OK();
}

Status PointerDevice(const void* pointer, int* device) {
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, pointer);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, "cudaPointerGetAttributes");
  }
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return Status::InvalidArgument("the pointer is not GPU memory");
  }
  *device = attributes.device;
  return Status::OK();
}

Status DefaultDevice(int local_rank, int* device) {
  if (g_device.load() >= 0) {
    *device = g_device.load();
    return Status::OK();
  }
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(error, "cudaGetDeviceCount");
  }
  if (count == 0) return Status::InvalidArgument("no CUDA device is visible to this rank");
  // Later GPU tensors of this process must be on the device NCCL now uses.
  int expected = -1;
  g_device.compare_exchange_strong(expected, local_rank % count);
  *device = g_device.load();
  return Status::OK();
}

std::map<std::string, std::string> VersionInfo() {
  std::map<std::string, std::string> info;
  info["cuda_compiled"] = VersionString(CUDART_VERSION, 1000, 10, 100);
  int runtime = 0, driver = 0;
  info["cuda_runtime"] = cudaRuntimeGetVersion(&runtime) == cudaSuccess
                             ? VersionString(runtime, 1000, 10, 100)
                             : "unknown";
  info["cuda_driver"] = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0
                            ? VersionString(driver, 1000, 10, 100)
                            : "none (no NVIDIA driver on this machine)";
  info["cuda_architectures"] = HORA_CUDA_ARCHITECTURES;
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  info["cuda_devices"] = error == cudaSuccess ? std::to_string(count)
                                              : "0 (" + std::string(cudaGetErrorName(error)) + ")";
  cudaGetLastError();  // a failed query must not poison later calls
  return info;
}

}  // namespace gpu
}  // namespace hora
