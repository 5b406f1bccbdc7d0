#pragma once
// What the engine and the bindings need from the GPU path, in types that
// compile without CUDA. A CUDA build implements it in this folder (NCCL
// collectives, CUDA kernels); a CPU-only build links gpu_backend_none.cc,
// whose functions report that GPU support was not compiled in.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/common/status.h"
#include "hora/core/config.h"
#include "hora/core/message.h"
#include "hora/core/tensor_queue.h"

namespace hora {

// Runs collectives whose tensors live on a GPU. Every call is made on the
// engine thread, in the same order on every rank. A call queues its work on
// the backend's stream after each entry's ready event, and before returning
// makes each caller's stream wait for that work: the Works can then be
// completed at once, and the caller's next kernels see the results. Nothing
// here synchronizes the device.
class GpuBackend {
 public:
  virtual ~GpuBackend() = default;
  // batch[k] runs on entries[k] where present[k]; an absent entry is a
  // rank that has joined and contributes neutral values.
  virtual Status Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                           const std::vector<bool>& present) = 0;
  virtual Status Allgather(const Response& response, TensorEntry& entry) = 0;
  virtual Status Broadcast(const Response& response, TensorEntry& entry) = 0;
  virtual Status Alltoall(const Response& response, TensorEntry& entry) = 0;
  virtual Status Reducescatter(const Response& response, TensorEntry& entry) = 0;
  virtual std::string Describe() const = 0;
};

namespace gpu {

// Whether this build has the CUDA/NCCL path.
bool BuiltIn();
// Collective over `comm`: sets up NCCL on `device` (-1: DefaultDevice),
// checking first that no two ranks of a host share one GPU. Called on the
// engine thread when the first GPU collective runs, which is the same
// response on every rank; a failure on any rank fails it on all of them.
Status CreateBackend(Communicator* comm, const Config& config, int device,
                     std::unique_ptr<GpuBackend>* out);
// The GPU a rank that has joined (and so has no tensor of its own) uses:
// the current device of the engine thread's first GPU use, else local_rank
// modulo the number of visible devices.
Status DefaultDevice(int local_rank, int* device);
// On the caller's thread at submission: records an event on `stream`
// (0 is the legacy default stream) on `device`. The returned owner gives the
// event back to a pool when the last copy goes away.
Status RecordReady(int device, uintptr_t stream, std::shared_ptr<void>* event);
// The device that owns `pointer` (for __cuda_array_interface__, which does
// not say).
Status PointerDevice(const void* pointer, int* device);
// Versions and settings for build_info(): cuda_runtime, cuda_driver, nccl,
// cuda_architectures, devices. Empty in a CPU-only build.
std::map<std::string, std::string> VersionInfo();

}  // namespace gpu
}  // namespace hora
