#pragma once
// The one reader of the environment. Every tunable has a HORA_ name with its
// unit in it; the HOROVOD_ name of the same setting is accepted so existing
// job scripts keep working. Nothing else in the core calls getenv.
#include <cstdint>
#include <functional>
#include <string>

#include "hora/common/collective.h"
#include "hora/common/logging.h"
#include "hora/common/status.h"
#include "hora/core/shared_gpu.h"

namespace hora {

struct Config {
  int64_t fusion_threshold_bytes = 128ll * 1024 * 1024;
  // Minimum spacing between negotiation cycles while work keeps arriving.
  // 0 means a cycle starts as soon as a tensor is submitted; tensors that
  // arrive while a cycle runs are fused into the next one.
  double cycle_time_ms = 0.0;
  int64_t cache_capacity = 1024;
  LogLevel log_level = LogLevel::kWarning;
  // HORA_LOG_HIDE_TIME: log lines without the time.
  bool log_hide_time = false;
  // Parsed once from HORA_ALLREDUCE_ALGORITHM (see common/collective.h).
  AllreduceAlgorithm allreduce_algorithm = AllreduceAlgorithm::kAuto;
  // "auto": allreduces up to this many bytes use MPI's latency-optimal one.
  int64_t small_allreduce_bytes = 64 * 1024;
  // GPU allreduce across hosts: NCCL reduce-scatter inside each host, MPI
  // between hosts, NCCL allgather inside each host (instead of one NCCL
  // allreduce over every rank). Needs the same number of ranks per host.
  bool gpu_hierarchical_allreduce = false;
  // Ranks of one host on the same GPU, which NCCL refuses
  // (HORA_SHARED_GPU=auto|stage|error; see core/shared_gpu.h).
  SharedGpuPolicy shared_gpu = SharedGpuPolicy::kAuto;
  // Bytes of one shared-memory pipeline slot (kSlots per rank).
  int64_t shm_slot_bytes = 1024 * 1024;
  // Which host this rank counts as (default: ranks sharing memory form a
  // host). Lets one machine stand in for several in tests.
  std::string hostname;
  // hora's own TCP transport instead of MPI: the launcher's rendezvous
  // (host:port, HORA_RENDEZVOUS), the job's cookie there
  // (HORA_RENDEZVOUS_COOKIE) and this process's id among those the
  // launcher started (HORA_PROCESS_ID). horarun sets all three.
  std::string rendezvous;
  uint64_t rendezvous_cookie = 0;
  int64_t process_id = 0;
  // A process an in-place elastic world started to join it
  // (HORA_ELASTIC_JOINER_ID set; over TCP, its place comes from the
  // launcher's rendezvous).
  bool elastic_joiner = false;
  // What an Average divides by while ranks have joined: the world size, as
  // in Horovod and DDP (joined ranks count as zeros), or, with
  // HORA_JOIN_AVERAGE=contributors, the ranks that submitted the tensor.
  bool join_average_over_contributors = false;
  // hora.add_process_set / remove_process_set after init are allowed
  // (hora.init(process_sets="dynamic") turns it on too).
  bool dynamic_process_sets = false;
  // Element-wise kernel set: auto, generic, avx2, avx512.
  std::string cpu_kernels = "auto";
  // While a caller waits for a result, and this long after, engines run
  // cycles back to back instead of sleeping, so the next tensor starts at
  // once. 0 turns it off; it is also off when the host has more ranks than
  // cores.
  int64_t spin_us = 200;
  // DistributedOptimizer (torch, TensorFlow, Keras): gradients are handed to
  // the engine in buckets of up to this many bytes, in the order the
  // backward pass produces them (the first bucket closes once it reaches
  // 1 MiB, so communication starts early). 0: one allreduce per gradient,
  // as Horovod.
  int64_t gradient_bucket_bytes = 25ll * 1024 * 1024;
  // HORA_EXACT_REDUCE_GRADIENTS: the gradients of allreduce and
  // reducescatter with Min, Max and Product are those of the sum of the
  // ranks' losses, not Horovod's (the op repeated on the gradients; the
  // gathered gradient).
  bool exact_reduce_gradients = false;
  // Stall inspector (rank 0): a collective that some ranks have submitted
  // and others have not for this long is reported, naming the missing
  // ranks; after stall_shutdown_seconds (0: never) the job stops with that
  // message on every rank instead of hanging.
  bool stall_check = true;
  double stall_warning_seconds = 60.0;
  double stall_shutdown_seconds = 0.0;
  // After ranks were lost in place, MPI_Finalize may wait for them for
  // ever (Open MPI fences the job's first world): this long, then the
  // process ends without it.
  double finalize_grace_seconds = 10.0;
  // Rank 0 writes a Chrome-trace timeline here from init on ("": none).
  std::string timeline_path;
  bool timeline_mark_cycles = false;
  // Events that may wait for the timeline's writer; beyond it they are
  // dropped (and that is logged once).
  int64_t timeline_queue_events = 1 << 16;
  // Autotuning (rank 0 searches, every rank applies): settings given
  // explicitly are held fixed.
  bool autotune = false;
  std::string autotune_log;
  double autotune_sample_seconds = 2.0;
  int64_t autotune_warmup_samples = 1;
  bool fusion_threshold_explicit = false;
  bool cycle_time_explicit = false;
  bool cache_capacity_explicit = false;

  // Reads the settings through `lookup` (getenv in production, a map in
  // tests). Returns an error naming the variable and its value when a value
  // cannot be parsed or is out of range.
  static Status Load(const std::function<const char*(const char*)>& lookup, Config* config);
  static Status FromEnvironment(Config* config);

  std::string Describe() const;
};

}  // namespace hora
