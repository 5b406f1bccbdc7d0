#pragma once
// The vocabulary every layer shares: which collective, which reduction, and
// which allreduce algorithm. It lives at the bottom so that the transports
// and algorithms can speak it without knowing the engine's messages.
#include <cstdint>
#include <string>

namespace hora {

// The numeric values travel inside serialized requests and are exported to
// Python by `_C`, so they never change meaning; new kinds are appended.
enum class CollectiveKind : uint8_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kAlltoall = 3,
  kReducescatter = 4,
  kBarrier = 5,
  // Not a collective: rank 0's new engine settings (autotuning), which every
  // rank applies on the same cycle. shape = {fusion threshold bytes, cycle
  // time in microseconds}.
  kParameters = 6,
  // Not a collective: every rank adds or removes a process set at the same
  // point of the global set's order. Add: shape = the set's ranks; remove:
  // shape = {the set's id}.
  kAddProcessSet = 7,
  kRemoveProcessSet = 8,
};
const char* CollectiveKindName(CollectiveKind kind);

// Numbered as Horovod numbers them, so user code passing the integers keeps
// its meaning.
enum class ReduceOp : uint8_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};
constexpr int kNumReduceOps = 6;
const char* ReduceOpName(ReduceOp op);

// Which allreduce algorithm runs. kAuto picks by size and placement (MPI's
// own for small messages; shared memory on one host; hierarchical across
// hosts); the others force one path for every size, which is how the tests
// cover each of them.
enum class AllreduceAlgorithm : uint8_t { kAuto, kMpi, kRing, kShm, kHierarchical };
const char* AllreduceAlgorithmName(AllreduceAlgorithm algorithm);
// False when `text` names no algorithm.
bool ParseAllreduceAlgorithm(const std::string& text, AllreduceAlgorithm* out);

}  // namespace hora
