#pragma once
// Process-wide GPU helpers in types that compile without CUDA: a CUDA build
// implements them in device_runtime.cc, a CPU-only build links
// device_runtime_none.cc, whose functions say that GPU support was not
// compiled in.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "hora/common/status.h"

namespace hora {
namespace gpu {

// Whether this build has the CUDA/NCCL path.
bool BuiltIn();
// The error every GPU entry point of a CPU-only build returns (defined in
// CPU-only builds only).
Status NotBuilt();
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
// CUDA versions and settings for build_info(): cuda_runtime, cuda_driver,
// cuda_architectures, cuda_devices. Empty in a CPU-only build.
std::map<std::string, std::string> VersionInfo();

}  // namespace gpu
}  // namespace hora
