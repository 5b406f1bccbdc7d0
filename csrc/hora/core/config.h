#pragma once
// The one reader of the environment. Every tunable has a HORA_ name with its
// unit in it; the HOROVOD_ name of the same setting is accepted so existing
// job scripts keep working. Nothing else in the core calls getenv.
#include <cstdint>
#include <functional>
#include <string>

#include "hora/common/logging.h"
#include "hora/common/status.h"

namespace hora {

struct Config {
  int64_t fusion_threshold_bytes = 128ll * 1024 * 1024;
  // Minimum spacing between negotiation cycles while work keeps arriving.
  // 0 means a cycle starts as soon as a tensor is submitted; tensors that
  // arrive while a cycle runs are fused into the next one.
  double cycle_time_ms = 0.0;
  int64_t cache_capacity = 1024;
  LogLevel log_level = LogLevel::kWarning;
  // Which allreduce runs inside one host: "auto" (currently MPI), "shm"
  // (shared memory; every rank must be on one host) or "mpi". Forcing one
  // lets the tests cover each path.
  std::string allreduce_algorithm = "auto";
  // Bytes of one shared-memory pipeline slot (two per rank).
  int64_t shm_slot_bytes = 256 * 1024;

  // Reads the settings through `lookup` (getenv in production, a map in
  // tests). Returns an error naming the variable and its value when a value
  // cannot be parsed or is out of range.
  static Status Load(const std::function<const char*(const char*)>& lookup, Config* config);
  static Status FromEnvironment(Config* config);

  std::string Describe() const;
};

}  // namespace hora
