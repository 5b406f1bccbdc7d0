#include "hora/core/gpu_executor_staged.h"

#include "hora/cuda/cuda_status.h"

namespace hora {
namespace gpu {
namespace {

int64_t Align64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

Response OnHost(const Response& response) {
  Response copy = response;
  copy.on_gpu = false;
  return copy;
}

}  // namespace

StagedExecutor::~StagedExecutor() {
  gpu_->Drain();
  if (pinned_ != nullptr) cudaFreeHost(pinned_);
}

std::string StagedExecutor::Describe() const {
  return "host staging on GPU " + std::to_string(device_) + " (" + why_ + ")";
}

Status StagedExecutor::Pinned(int64_t bytes, char** out) {
  if (bytes > pinned_bytes_) {
    if (pinned_ != nullptr) HORA_CUDA(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    const int64_t rounded = (bytes + (1 << 20) - 1) / (1 << 20) * (1 << 20);
    void* p = nullptr;
    HORA_CUDA(cudaMallocHost(&p, rounded));
    pinned_ = static_cast<char*>(p);
    pinned_bytes_ = rounded;
  }
  *out = pinned_;
  return Status::OK();
}

Status StagedExecutor::Allreduce(const Response* batch, size_t batch_size, TensorEntry* entries,
                                 const std::vector<bool>& present, const CollectivePlan&) {
  HORA_RETURN_IF_ERROR(WaitForCallers(entries, batch_size, &present));
  std::vector<int64_t> offsets(batch_size, 0);
  int64_t total = 0;
  for (size_t k = 0; k < batch_size; ++k) {
    offsets[k] = total;
    if (present[k]) total += Align64(entries[k].input.NumBytes());
  }
  char* host = nullptr;
  HORA_RETURN_IF_ERROR(Pinned(total, &host));
  // The copies are reduced in place: each present tensor's slot is both
  // the CPU path's input and its output.
  std::vector<Response> host_batch;
  host_batch.reserve(batch_size);
  std::vector<TensorEntry> staged(batch_size);
  for (size_t k = 0; k < batch_size; ++k) {
    host_batch.push_back(OnHost(batch[k]));
    if (!present[k]) continue;
    const TensorEntry& e = entries[k];
    char* slot = host + offsets[k];
    HORA_CUDA(
        cudaMemcpyAsync(slot, e.input.data, e.input.NumBytes(), cudaMemcpyDeviceToHost, stream_));
    staged[k].input = e.input;
    staged[k].input.data = slot;
    staged[k].input.device = -1;
    staged[k].output = slot;
    staged[k].work = e.work;
  }
  HORA_CUDA(cudaStreamSynchronize(stream_));
  const CollectivePlan plan =
      PlanCollective(host_batch[0], host_batch[0].shape, comm_->rank(), comm_->size());
  HORA_RETURN_IF_ERROR(
      host_->Allreduce(host_batch.data(), batch_size, staged.data(), present, plan));
  for (size_t k = 0; k < batch_size; ++k) {
    if (!present[k]) continue;
    HORA_CUDA(cudaMemcpyAsync(entries[k].output, host + offsets[k], entries[k].input.NumBytes(),
                              cudaMemcpyHostToDevice, stream_));
  }
  // The pinned buffer is reused by the next collective.
  HORA_CUDA(cudaStreamSynchronize(stream_));
  return ReleaseCallers(entries, batch_size, &present);
}

Status StagedExecutor::Run(const Response& response, TensorEntry& e, const CollectivePlan&) {
  HORA_RETURN_IF_ERROR(WaitForCallers(&e, 1, nullptr));
  const int64_t bytes = e.input.NumBytes();
  const bool broadcast = response.kind == CollectiveKind::kBroadcast;
  const bool separate_output = broadcast && e.output != e.input.data;
  char* host = nullptr;
  HORA_RETURN_IF_ERROR(Pinned(Align64(bytes) * (separate_output ? 2 : 1), &host));
  if (bytes > 0)
    HORA_CUDA(cudaMemcpyAsync(host, e.input.data, bytes, cudaMemcpyDeviceToHost, stream_));
  HORA_CUDA(cudaStreamSynchronize(stream_));
  TensorEntry staged;
  staged.input = e.input;
  staged.input.data = host;
  staged.input.device = -1;
  // A broadcast writes into the host copy (or beside it); the others leave
  // their result in a buffer the CPU path allocates, never in place.
  staged.output = !broadcast ? nullptr : separate_output ? host + Align64(bytes) : host;
  staged.work = e.work;
  const Response on_host = OnHost(response);
  const CollectivePlan plan = PlanCollective(on_host, e.input.shape, comm_->rank(), comm_->size());
  HORA_RETURN_IF_ERROR(host_->Run(on_host, staged, plan));
  if (broadcast) {
    if (bytes > 0) {
      HORA_CUDA(cudaMemcpyAsync(e.output, staged.output, bytes, cudaMemcpyHostToDevice, stream_));
    }
    HORA_CUDA(cudaStreamSynchronize(stream_));
    return ReleaseCallers(&e, 1, nullptr);
  }
  // Allgather, alltoall, reducescatter: the CPU path left its result in
  // the Work's host buffer; the caller gets it in device memory.
  std::shared_ptr<OwnedBuffer> result = std::move(e.work->output);
  const int64_t result_bytes = result ? static_cast<int64_t>(result->size()) : 0;
  std::shared_ptr<DeviceBuffer> out;
  HORA_RETURN_IF_ERROR(AllocateOutput(result_bytes, &out));
  if (result_bytes > 0) {
    HORA_CUDA(
        cudaMemcpyAsync(out->data, result->data(), result_bytes, cudaMemcpyHostToDevice, stream_));
  }
  // `result` is pageable memory that goes away when this returns.
  HORA_CUDA(cudaStreamSynchronize(stream_));
  return Deliver(e, std::move(out), plan);
}

}  // namespace gpu
}  // namespace hora
