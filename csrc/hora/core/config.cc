#include "hora/core/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

namespace hora {
namespace {

struct Source {
  const char* name;   // which variable supplied the value
  const char* value;  // nullptr when neither is set
};

Source Find(const std::function<const char*(const char*)>& lookup, const char* primary,
            const char* alias) {
  const char* value = lookup(primary);
  if (value != nullptr && *value != '\0') return {primary, value};
  if (alias != nullptr) {
    value = lookup(alias);
    if (value != nullptr && *value != '\0') return {alias, value};
  }
  return {primary, nullptr};
}

Status Invalid(const Source& source, const char* expected) {
  std::ostringstream message;
  message << "environment variable " << source.name << "='" << source.value << "' is not "
          << expected;
  return Status::InvalidArgument(message.str());
}

Status ReadInt(const Source& source, int64_t minimum, int64_t* out) {
  if (source.value == nullptr) return Status::OK();
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(source.value, &end, 10);
  // Out of range (ERANGE) is an error, not the clamped extreme.
  if (end == source.value || *end != '\0' || errno == ERANGE || parsed < minimum) {
    return Invalid(source, minimum == 0 ? "a non-negative integer" : "a positive integer");
  }
  *out = parsed;
  return Status::OK();
}

Status ReadDouble(const Source& source, double* out) {
  if (source.value == nullptr) return Status::OK();
  char* end = nullptr;
  const double parsed = std::strtod(source.value, &end);
  // NaN and infinity are no durations (an infinite cycle time would
  // overflow the engine's wait).
  if (end == source.value || *end != '\0' || !std::isfinite(parsed) || parsed < 0) {
    return Invalid(source, "a non-negative number");
  }
  *out = parsed;
  return Status::OK();
}

Status ReadBool(const Source& source, bool* out) {
  if (source.value == nullptr) return Status::OK();
  const std::string text = source.value;
  if (text == "1" || text == "true" || text == "True" || text == "yes") {
    *out = true;
  } else if (text == "0" || text == "false" || text == "False" || text == "no") {
    *out = false;
  } else {
    return Invalid(source, "1 or 0");
  }
  return Status::OK();
}

}  // namespace

Status Config::Load(const std::function<const char*(const char*)>& lookup, Config* config) {
  Config result;
  const Source threshold = Find(lookup, "HORA_FUSION_THRESHOLD_BYTES", "HOROVOD_FUSION_THRESHOLD");
  HORA_RETURN_IF_ERROR(ReadInt(threshold, 0, &result.fusion_threshold_bytes));
  result.fusion_threshold_explicit = threshold.value != nullptr;
  const Source cycle = Find(lookup, "HORA_CYCLE_TIME_MS", "HOROVOD_CYCLE_TIME");
  HORA_RETURN_IF_ERROR(ReadDouble(cycle, &result.cycle_time_ms));
  result.cycle_time_explicit = cycle.value != nullptr;
  HORA_RETURN_IF_ERROR(
      ReadBool(Find(lookup, "HORA_AUTOTUNE", "HOROVOD_AUTOTUNE"), &result.autotune));
  const Source autotune_log = Find(lookup, "HORA_AUTOTUNE_LOG", "HOROVOD_AUTOTUNE_LOG");
  if (autotune_log.value != nullptr) result.autotune_log = autotune_log.value;
  HORA_RETURN_IF_ERROR(ReadDouble(Find(lookup, "HORA_AUTOTUNE_SAMPLE_SECONDS", nullptr),
                                  &result.autotune_sample_seconds));
  HORA_RETURN_IF_ERROR(
      ReadInt(Find(lookup, "HORA_AUTOTUNE_WARMUP_SAMPLES", "HOROVOD_AUTOTUNE_WARMUP_SAMPLES"), 0,
              &result.autotune_warmup_samples));
  const Source cache = Find(lookup, "HORA_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY");
  HORA_RETURN_IF_ERROR(ReadInt(cache, 0, &result.cache_capacity));
  result.cache_capacity_explicit = cache.value != nullptr;
  HORA_RETURN_IF_ERROR(
      ReadInt(Find(lookup, "HORA_SHM_SLOT_BYTES", nullptr), 1, &result.shm_slot_bytes));
  HORA_RETURN_IF_ERROR(ReadInt(Find(lookup, "HORA_SMALL_ALLREDUCE_BYTES", nullptr), 0,
                               &result.small_allreduce_bytes));
  HORA_RETURN_IF_ERROR(ReadInt(Find(lookup, "HORA_SPIN_US", nullptr), 0, &result.spin_us));
  HORA_RETURN_IF_ERROR(ReadInt(Find(lookup, "HORA_GRADIENT_BUCKET_BYTES", nullptr), 0,
                               &result.gradient_bucket_bytes));
  HORA_RETURN_IF_ERROR(ReadBool(Find(lookup, "HORA_EXACT_REDUCE_GRADIENTS", nullptr),
                                &result.exact_reduce_gradients));
  const Source algorithm = Find(lookup, "HORA_ALLREDUCE_ALGORITHM", nullptr);
  if (algorithm.value != nullptr) {
    if (!ParseAllreduceAlgorithm(algorithm.value, &result.allreduce_algorithm)) {
      return Invalid(algorithm, "one of auto, mpi, ring, shm, hierarchical");
    }
  }
  HORA_RETURN_IF_ERROR(
      ReadBool(Find(lookup, "HORA_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE"),
               &result.gpu_hierarchical_allreduce));
  const Source shared_gpu = Find(lookup, "HORA_SHARED_GPU", nullptr);
  if (shared_gpu.value != nullptr) {
    const std::string value = shared_gpu.value;
    if (value == "auto") {
      result.shared_gpu = SharedGpuPolicy::kAuto;
    } else if (value == "stage") {
      result.shared_gpu = SharedGpuPolicy::kStage;
    } else if (value == "error") {
      result.shared_gpu = SharedGpuPolicy::kError;
    } else {
      return Invalid(shared_gpu, "auto, stage or error");
    }
  }
  HORA_RETURN_IF_ERROR(
      ReadBool(Find(lookup, "HORA_DYNAMIC_PROCESS_SETS", "HOROVOD_DYNAMIC_PROCESS_SETS"),
               &result.dynamic_process_sets));
  const Source kernels = Find(lookup, "HORA_CPU_KERNELS", nullptr);
  if (kernels.value != nullptr) {
    result.cpu_kernels = kernels.value;
    const std::string& k = result.cpu_kernels;
    if (k != "auto" && k != "generic" && k != "avx2" && k != "avx512") {
      return Invalid(kernels, "one of auto, generic, avx2, avx512");
    }
  }
  const Source join_average = Find(lookup, "HORA_JOIN_AVERAGE", nullptr);
  if (join_average.value != nullptr) {
    const std::string value = join_average.value;
    if (value != "size" && value != "contributors") {
      return Invalid(join_average, "size or contributors");
    }
    result.join_average_over_contributors = value == "contributors";
  }
  bool stall_disabled = false;
  HORA_RETURN_IF_ERROR(ReadBool(
      Find(lookup, "HORA_STALL_CHECK_DISABLE", "HOROVOD_STALL_CHECK_DISABLE"), &stall_disabled));
  result.stall_check = !stall_disabled;
  HORA_RETURN_IF_ERROR(
      ReadDouble(Find(lookup, "HORA_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_CHECK_TIME_SECONDS"),
                 &result.stall_warning_seconds));
  HORA_RETURN_IF_ERROR(ReadDouble(
      Find(lookup, "HORA_STALL_SHUTDOWN_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"),
      &result.stall_shutdown_seconds));
  if (result.stall_warning_seconds <= 0) result.stall_check = false;
  HORA_RETURN_IF_ERROR(ReadDouble(Find(lookup, "HORA_FINALIZE_GRACE_SECONDS", nullptr),
                                  &result.finalize_grace_seconds));
  // A year is as good as never, and keeps these times from overflowing the
  // nanosecond clocks they are compared on.
  constexpr double kYearSeconds = 365.0 * 24 * 3600;
  result.stall_warning_seconds = std::min(result.stall_warning_seconds, kYearSeconds);
  result.stall_shutdown_seconds = std::min(result.stall_shutdown_seconds, kYearSeconds);
  result.finalize_grace_seconds = std::min(result.finalize_grace_seconds, kYearSeconds);
  const Source timeline = Find(lookup, "HORA_TIMELINE", "HOROVOD_TIMELINE");
  if (timeline.value != nullptr) result.timeline_path = timeline.value;
  HORA_RETURN_IF_ERROR(
      ReadBool(Find(lookup, "HORA_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES"),
               &result.timeline_mark_cycles));
  HORA_RETURN_IF_ERROR(ReadInt(Find(lookup, "HORA_TIMELINE_QUEUE_EVENTS", nullptr), 1,
                               &result.timeline_queue_events));
  const Source hostname = Find(lookup, "HORA_HOSTNAME", nullptr);
  if (hostname.value != nullptr) result.hostname = hostname.value;
  const Source rendezvous = Find(lookup, "HORA_RENDEZVOUS", nullptr);
  if (rendezvous.value != nullptr) result.rendezvous = rendezvous.value;
  int64_t cookie = 0;
  HORA_RETURN_IF_ERROR(ReadInt(Find(lookup, "HORA_RENDEZVOUS_COOKIE", nullptr), 0, &cookie));
  result.rendezvous_cookie = static_cast<uint64_t>(cookie);
  HORA_RETURN_IF_ERROR(ReadInt(Find(lookup, "HORA_PROCESS_ID", nullptr), 0, &result.process_id));
  result.elastic_joiner = Find(lookup, "HORA_ELASTIC_JOINER_ID", nullptr).value != nullptr;
  const Source level = Find(lookup, "HORA_LOG_LEVEL", "HOROVOD_LOG_LEVEL");
  if (level.value != nullptr && !ParseLogLevel(level.value, &result.log_level)) {
    return Invalid(level, "one of trace, debug, info, warning, error, fatal, off");
  }
  HORA_RETURN_IF_ERROR(
      ReadBool(Find(lookup, "HORA_LOG_HIDE_TIME", "HOROVOD_LOG_HIDE_TIME"), &result.log_hide_time));
  *config = result;
  return Status::OK();
}

Status Config::FromEnvironment(Config* config) {
  return Load([](const char* name) { return std::getenv(name); }, config);
}

std::string Config::Describe() const {
  std::ostringstream text;
  text << "fusion_threshold_bytes=" << fusion_threshold_bytes << " cycle_time_ms=" << cycle_time_ms
       << " cache_capacity=" << cache_capacity
       << " allreduce_algorithm=" << AllreduceAlgorithmName(allreduce_algorithm)
       << " small_allreduce_bytes=" << small_allreduce_bytes << " shm_slot_bytes=" << shm_slot_bytes
       << " join_average=" << (join_average_over_contributors ? "contributors" : "size")
       << " cpu_kernels=" << cpu_kernels << " spin_us=" << spin_us
       << " stall_check=" << (stall_check ? stall_warning_seconds : 0.0) << "s"
       << " stall_shutdown=" << stall_shutdown_seconds << "s" << (autotune ? " autotune=on" : "")
       << (hostname.empty() ? "" : " hostname=" + hostname)
       << (rendezvous.empty() ? "" : " transport=tcp rendezvous=" + rendezvous);
  return text.str();
}

}  // namespace hora
