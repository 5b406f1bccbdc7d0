#pragma once
// Ranks of one host on the same GPU. NCCL refuses them, so a job either runs
// its GPU collectives through host memory or fails, naming the ranks. The
// choice is made from what every rank reports about its GPU, the same on
// every rank; it needs no CUDA, so it is tested without a GPU.
#include <cstdint>
#include <string>
#include <vector>

namespace hora {

// HORA_SHARED_GPU: auto stages when a host has fewer GPUs than ranks (there
// is no other way to run the job there) and fails when it has enough (a
// rank forgot to pick its own GPU, and staging would hide that behind slow
// steps); stage and error do so always.
enum class SharedGpuPolicy { kAuto, kStage, kError };

// What a rank tells the others about its GPU (exchanged as raw bytes).
struct GpuCard {
  uint8_t uuid[16];
  uint64_t host;  // hash of the host's name
  int32_t rank;
  int32_t device;   // the index in this rank's process
  int32_t visible;  // GPUs this rank's process can see
  int32_t ok;       // its GPU setup succeeded
};

struct SharedGpuChoice {
  std::string shared;  // empty: every rank of a host has a GPU of its own
  bool stage = false;  // run through host memory (else, if shared, fail)
  std::string error;   // what the failure says
};

SharedGpuChoice ChooseSharedGpu(const std::vector<GpuCard>& cards, SharedGpuPolicy policy);

}  // namespace hora
