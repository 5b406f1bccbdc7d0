#include "hora/core/shared_gpu.h"

#include <cstring>

namespace hora {

SharedGpuChoice ChooseSharedGpu(const std::vector<GpuCard>& cards, SharedGpuPolicy policy) {
  SharedGpuChoice choice;
  const GpuCard* first = nullptr;
  const GpuCard* second = nullptr;
  for (size_t a = 0; a < cards.size() && first == nullptr; ++a) {
    for (size_t b = a + 1; b < cards.size(); ++b) {
      if (cards[a].host == cards[b].host && std::memcmp(cards[a].uuid, cards[b].uuid, 16) == 0) {
        first = &cards[a];
        second = &cards[b];
        break;
      }
    }
  }
  if (first == nullptr) return choice;
  choice.shared = "ranks " + std::to_string(first->rank) + " and " + std::to_string(second->rank) +
                  " on one host both use the same GPU (device " + std::to_string(first->device) +
                  " and device " + std::to_string(second->device) + " of their processes)";
  int ranks_on_host = 0;
  for (const GpuCard& c : cards) ranks_on_host += c.host == first->host ? 1 : 0;
  const bool too_few_gpus = first->visible < ranks_on_host;
  choice.stage =
      policy == SharedGpuPolicy::kStage || (policy == SharedGpuPolicy::kAuto && too_few_gpus);
  if (choice.stage) return choice;
  const std::string gpus = std::to_string(first->visible) + " GPU" +
                           (first->visible == 1 ? "" : "s") + " for its " +
                           std::to_string(ranks_on_host) + " ranks";
  choice.error = choice.shared + "; NCCL needs a GPU per rank, and the host has " + gpus +
                 ". Give each rank its own GPU, e.g. torch.cuda.set_device(hvd.local_rank()), "
                 "or set CUDA_VISIBLE_DEVICES per rank; HORA_SHARED_GPU=stage runs such a job "
                 "through host memory instead (slow)";
  return choice;
}

}  // namespace hora
