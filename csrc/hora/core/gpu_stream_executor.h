#pragma once
// What every GPU executor of a CUDA build shares: the device, a stream of
// its own and the event that hands its work back to the callers' streams,
// and results allocated in stream order.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "hora/core/gpu_executor.h"

namespace hora {
namespace gpu {

// The device and stream an executor works on, made before the ranks agree
// on the path (so that a failure to make them is part of what they agree
// on). Destroys the stream after letting queued work finish.
struct GpuStream {
  int device = -1;
  cudaStream_t stream = nullptr;
  cudaEvent_t done = nullptr;

  GpuStream() = default;
  GpuStream(const GpuStream&) = delete;
  GpuStream& operator=(const GpuStream&) = delete;
  ~GpuStream();
  // Sets the calling thread's device to `device` and makes the stream and
  // the event.
  Status Open(int device);
  // Waits up to ten seconds for the work queued on the stream (past that
  // the peers are gone).
  void Drain();
};

class StreamExecutor : public GpuExecutor {
 protected:
  explicit StreamExecutor(std::unique_ptr<GpuStream> stream)
      : gpu_(std::move(stream)), device_(gpu_->device), stream_(gpu_->stream) {}

  // Our stream waits for what the callers queued before submitting.
  Status WaitForCallers(TensorEntry* entries, size_t count, const std::vector<bool>* present);
  // Each caller's stream waits for everything queued on ours so far.
  Status ReleaseCallers(TensorEntry* entries, size_t count, const std::vector<bool>* present);
  // Result memory for the caller, allocated in order on our stream; once
  // HandOver has run it is freed in order on the caller's stream.
  Status AllocateOutput(int64_t bytes, std::shared_ptr<DeviceBuffer>* out);
  void HandOver(DeviceBuffer* buffer, uintptr_t caller_stream);
  // Gives `entry` the result in `out`, shaped as the plan says.
  Status Deliver(TensorEntry& entry, std::shared_ptr<DeviceBuffer> out, const CollectivePlan& plan);

  std::unique_ptr<GpuStream> gpu_;
  const int device_;
  const cudaStream_t stream_;
};

}  // namespace gpu
}  // namespace hora
