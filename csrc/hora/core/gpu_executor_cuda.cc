// The GPU path of a CUDA build: every rank tells the others which GPU it
// holds, then all of them pick the same executor (NCCL, or host staging
// where ranks of one host share a GPU), or all fail with the same error.
#include <cstring>
#include <memory>
#include <sstream>

#include "hora/common/logging.h"
#include "hora/core/gpu_executor.h"
#include "hora/core/gpu_executor_nccl.h"
#include "hora/core/gpu_executor_staged.h"
#include "hora/core/shared_gpu.h"
#include "hora/cuda/cuda_status.h"
#include "hora/cuda/device_runtime.h"

namespace hora {
namespace {

uint64_t HashName(const std::string& text) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// This rank's part: picks the device and opens the stream on it.
Status OpenLocal(const Communicator* comm, int device, gpu::GpuStream* stream, GpuCard* card) {
  if (device < 0) HORA_RETURN_IF_ERROR(gpu::DefaultDevice(comm->topology().local_rank, &device));
  card->device = device;
  HORA_RETURN_IF_ERROR(stream->Open(device));
  int visible = 0;
  HORA_RETURN_IF_ERROR(gpu::CudaStatus(cudaGetDeviceCount(&visible), "cudaGetDeviceCount"));
  card->visible = visible;
  cudaDeviceProp properties{};
  HORA_RETURN_IF_ERROR(
      gpu::CudaStatus(cudaGetDeviceProperties(&properties, device), "cudaGetDeviceProperties"));
  std::memcpy(card->uuid, &properties.uuid, sizeof(card->uuid));
  return Status::OK();
}

}  // namespace

Status CreateGpuExecutor(Communicator* comm, const GpuOptions& options, int device,
                         CollectivePath* host, std::unique_ptr<GpuExecutor>* out) {
  // Every rank first does its local part, then all exchange the outcome, so
  // a failure anywhere becomes the same error everywhere instead of a hang.
  auto stream = std::make_unique<gpu::GpuStream>();
  GpuCard mine{};
  mine.rank = comm->rank();
  mine.host = HashName(comm->topology().hostname);
  mine.device = device;
  Status local = OpenLocal(comm, device, stream.get(), &mine);
  if (!local.ok()) cudaGetLastError();
  mine.ok = local.ok() ? 1 : 0;
  const int size = comm->size();
  std::vector<GpuCard> cards(size);
  HORA_RETURN_IF_ERROR(comm->Allgatherv(&mine, sizeof(mine), cards.data(),
                                        std::vector<int64_t>(size, sizeof(GpuCard))));
  if (!local.ok()) return local.WithContext("setting up this rank's GPU");
  std::ostringstream failed;
  for (const GpuCard& c : cards) {
    if (!c.ok) failed << (failed.tellp() > 0 ? ", " : "") << c.rank;
  }
  if (failed.tellp() > 0) {
    return Status::Internal("GPU setup failed on rank(s) " + failed.str() + "; see their errors");
  }
  const SharedGpuChoice choice = ChooseSharedGpu(cards, options.shared_gpu);
  if (choice.shared.empty()) {
    return gpu::NcclExecutor::Create(comm, options.hierarchical, std::move(stream), out);
  }
  if (!choice.stage) return Status::InvalidArgument(choice.error);
  if (comm->rank() == 0) {
    HORA_LOG(kWarning) << choice.shared
                       << ", which NCCL does not allow: this job's GPU collectives are copied "
                          "through host memory and run on the CPU path (correct, but slow). "
                          "Give each rank its own GPU for NCCL; HORA_SHARED_GPU=error makes "
                          "this an error instead.";
  }
  *out = std::make_unique<gpu::StagedExecutor>(comm, host, std::move(stream), choice.shared);
  return Status::OK();
}

}  // namespace hora
