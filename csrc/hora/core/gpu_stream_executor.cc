#include "hora/core/gpu_stream_executor.h"

#include <chrono>
#include <thread>

#include "hora/cuda/cuda_status.h"

namespace hora {
namespace gpu {

Status GpuStream::Open(int index) {
  device = index;
  HORA_CUDA(cudaSetDevice(device));
  HORA_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  HORA_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  return Status::OK();
}

void GpuStream::Drain() {
  if (stream == nullptr) return;
  DeviceGuard guard(device);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (cudaStreamQuery(stream) == cudaErrorNotReady &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

GpuStream::~GpuStream() {
  if (device < 0) return;
  Drain();
  DeviceGuard guard(device);
  if (done != nullptr) cudaEventDestroy(done);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

Status StreamExecutor::WaitForCallers(TensorEntry* entries, size_t count,
                                      const std::vector<bool>* present) {
  // The tensors of one submission share an event: one wait covers them.
  void* last = nullptr;
  for (size_t k = 0; k < count; ++k) {
    if ((present != nullptr && !(*present)[k]) || !entries[k].ready) continue;
    void* event = entries[k].ready.get();
    if (event != last) HORA_CUDA(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0));
    last = event;
    entries[k].ready.reset();  // back to the pool once no entry holds it: the wait captured it
  }
  return Status::OK();
}

Status StreamExecutor::ReleaseCallers(TensorEntry* entries, size_t count,
                                      const std::vector<bool>* present) {
  HORA_CUDA(cudaEventRecord(gpu_->done, stream_));
  uintptr_t last = ~uintptr_t{0};
  for (size_t k = 0; k < count; ++k) {
    if ((present != nullptr && !(*present)[k]) || entries[k].stream == last) continue;
    last = entries[k].stream;
    HORA_CUDA(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(last), gpu_->done, 0));
  }
  return Status::OK();
}

Status StreamExecutor::AllocateOutput(int64_t bytes, std::shared_ptr<DeviceBuffer>* out) {
  auto buffer = std::make_shared<DeviceBuffer>();
  HORA_CUDA(cudaMallocAsync(&buffer->data, bytes > 0 ? bytes : 1, stream_));
  buffer->bytes = bytes;
  buffer->device = device_;
  // Until it is handed over, only our stream has used it: a collective that
  // fails half-way frees it in order after whatever was queued on it.
  cudaStream_t stream = stream_;
  buffer->release = [stream](void* p) { cudaFreeAsync(p, stream); };
  *out = std::move(buffer);
  return Status::OK();
}

void StreamExecutor::HandOver(DeviceBuffer* buffer, uintptr_t caller_stream) {
  // The caller's stream has been made to wait for our work on the buffer,
  // and it is where the caller will use it: free it in order there.
  const int device = device_;
  buffer->release = [device, caller_stream](void* p) {
    DeviceGuard guard(device);
    cudaFreeAsync(p, reinterpret_cast<cudaStream_t>(caller_stream));
  };
}

Status StreamExecutor::Deliver(TensorEntry& e, std::shared_ptr<DeviceBuffer> out,
                               const CollectivePlan& plan) {
  HORA_RETURN_IF_ERROR(ReleaseCallers(&e, 1, nullptr));
  HandOver(out.get(), e.stream);
  e.work->device_output = std::move(out);
  e.work->output_shape = plan.output_shape;
  e.work->received_splits = plan.received_splits;
  return Status::OK();
}

}  // namespace gpu
}  // namespace hora
