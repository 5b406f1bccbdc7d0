#include <atomic>

#include "hora/algo/kernels/kernel_set.h"

namespace hora {
namespace {

bool Supports(const std::string& name) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (name == "avx512") {
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  }
  if (name == "avx2") {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("fma");
  }
#endif
  return name == "generic";
}

const KernelSet* Lookup(const std::string& name) {
#if defined(__x86_64__)
  if (name == "avx512") return &kernels_avx512::kSet;
  if (name == "avx2") return &kernels_avx2::kSet;
#endif
  if (name == "generic") return &kernels_generic::kSet;
  return nullptr;
}

const KernelSet* Best() {
  for (const char* name : {"avx512", "avx2"}) {
    if (Supports(name)) return Lookup(name);
  }
  return &kernels_generic::kSet;
}

std::atomic<const KernelSet*> g_active{nullptr};

}  // namespace

const KernelSet& Kernels() {
  const KernelSet* set = g_active.load(std::memory_order_acquire);
  if (set == nullptr) {
    set = Best();
    g_active.store(set, std::memory_order_release);
  }
  return *set;
}

std::vector<std::pair<std::string, bool>> KernelAvailability() {
  std::vector<std::pair<std::string, bool>> sets;
  for (const char* name : {"generic", "avx2", "avx512"}) {
    if (Lookup(name) != nullptr) sets.emplace_back(name, Supports(name));
  }
  return sets;
}

Status SelectKernels(const std::string& name) {
  if (name == "auto") {
    g_active.store(Best(), std::memory_order_release);
    return Status::OK();
  }
  const KernelSet* set = Lookup(name);
  if (set == nullptr) {
    return Status::InvalidArgument("HORA_CPU_KERNELS='" + name +
                                   "' is not one of auto, generic, avx2, avx512");
  }
  if (!Supports(name)) {
    return Status::InvalidArgument("HORA_CPU_KERNELS='" + name +
                                   "': this CPU lacks the instructions that kernel set needs");
  }
  g_active.store(set, std::memory_order_release);
  return Status::OK();
}

}  // namespace hora
