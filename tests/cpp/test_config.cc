// Config::Load through its lookup seam (a map instead of the environment):
// the defaults, the HORA_ names, the HOROVOD_ aliases (a HORA_ name wins
// when both are set), and malformed values refused with an InvalidArgument
// Status that names the variable and its value.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "hora/core/config.h"

namespace hora {
namespace {

using Env = std::map<std::string, std::string>;

Status LoadFrom(const Env& env, Config* config) {
  return Config::Load(
      [&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      config);
}

Config Loaded(const Env& env) {
  Config config;
  const Status status = LoadFrom(env, &config);
  EXPECT_TRUE(status.ok()) << status.message();
  return config;
}

TEST(Config, NothingSetGivesTheDefaults) {
  Config config;
  config.cache_capacity = 7;  // replaced by the loaded (default) value
  config.hostname = "stale";
  ASSERT_TRUE(LoadFrom({}, &config).ok());
  EXPECT_EQ(config.fusion_threshold_bytes, 128ll * 1024 * 1024);
  EXPECT_EQ(config.cycle_time_ms, 0.0);
  EXPECT_EQ(config.cache_capacity, 1024);
  EXPECT_EQ(config.log_level, LogLevel::kWarning);
  EXPECT_FALSE(config.log_hide_time);
  EXPECT_EQ(config.allreduce_algorithm, AllreduceAlgorithm::kAuto);
  EXPECT_EQ(config.small_allreduce_bytes, 64 * 1024);
  EXPECT_FALSE(config.gpu_hierarchical_allreduce);
  EXPECT_EQ(config.shared_gpu, SharedGpuPolicy::kAuto);
  EXPECT_EQ(config.shm_slot_bytes, 1024 * 1024);
  EXPECT_EQ(config.hostname, "");
  EXPECT_FALSE(config.join_average_over_contributors);
  EXPECT_FALSE(config.dynamic_process_sets);
  EXPECT_EQ(config.cpu_kernels, "auto");
  EXPECT_EQ(config.spin_us, 200);
  EXPECT_EQ(config.gradient_bucket_bytes, 25ll * 1024 * 1024);
  EXPECT_FALSE(config.exact_reduce_gradients);
  EXPECT_TRUE(config.stall_check);
  EXPECT_EQ(config.stall_warning_seconds, 60.0);
  EXPECT_EQ(config.stall_shutdown_seconds, 0.0);
  EXPECT_EQ(config.timeline_path, "");
  EXPECT_FALSE(config.timeline_mark_cycles);
  EXPECT_EQ(config.timeline_queue_events, 1 << 16);
  EXPECT_FALSE(config.autotune);
  EXPECT_EQ(config.autotune_log, "");
  EXPECT_EQ(config.autotune_sample_seconds, 2.0);
  EXPECT_EQ(config.autotune_warmup_samples, 1);
  EXPECT_FALSE(config.fusion_threshold_explicit);
  EXPECT_FALSE(config.cycle_time_explicit);
  EXPECT_FALSE(config.cache_capacity_explicit);
}

TEST(Config, ReadsTheHoraNames) {
  const Config config = Loaded({
      {"HORA_FUSION_THRESHOLD_BYTES", "1048576"},
      {"HORA_CYCLE_TIME_MS", "2.5"},
      {"HORA_CACHE_CAPACITY", "0"},
      {"HORA_AUTOTUNE", "true"},
      {"HORA_AUTOTUNE_LOG", "/tmp/tune.csv"},
      {"HORA_AUTOTUNE_SAMPLE_SECONDS", "0.5"},
      {"HORA_AUTOTUNE_WARMUP_SAMPLES", "3"},
      {"HORA_SHM_SLOT_BYTES", "4096"},
      {"HORA_SMALL_ALLREDUCE_BYTES", "0"},
      {"HORA_SPIN_US", "0"},
      {"HORA_GRADIENT_BUCKET_BYTES", "0"},
      {"HORA_EXACT_REDUCE_GRADIENTS", "1"},
      {"HORA_ALLREDUCE_ALGORITHM", "ring"},
      {"HORA_HIERARCHICAL_ALLREDUCE", "1"},
      {"HORA_SHARED_GPU", "stage"},
      {"HORA_DYNAMIC_PROCESS_SETS", "yes"},
      {"HORA_CPU_KERNELS", "generic"},
      {"HORA_JOIN_AVERAGE", "contributors"},
      {"HORA_STALL_CHECK_TIME_SECONDS", "5"},
      {"HORA_STALL_SHUTDOWN_TIME_SECONDS", "30"},
      {"HORA_TIMELINE", "/tmp/timeline.json"},
      {"HORA_TIMELINE_MARK_CYCLES", "1"},
      {"HORA_TIMELINE_QUEUE_EVENTS", "10"},
      {"HORA_HOSTNAME", "node7"},
      {"HORA_LOG_LEVEL", "DEBUG"},
      {"HORA_LOG_HIDE_TIME", "1"},
  });
  EXPECT_EQ(config.fusion_threshold_bytes, 1048576);
  EXPECT_TRUE(config.fusion_threshold_explicit);
  EXPECT_EQ(config.cycle_time_ms, 2.5);
  EXPECT_TRUE(config.cycle_time_explicit);
  EXPECT_EQ(config.cache_capacity, 0);
  EXPECT_TRUE(config.cache_capacity_explicit);
  EXPECT_TRUE(config.autotune);
  EXPECT_EQ(config.autotune_log, "/tmp/tune.csv");
  EXPECT_EQ(config.autotune_sample_seconds, 0.5);
  EXPECT_EQ(config.autotune_warmup_samples, 3);
  EXPECT_EQ(config.shm_slot_bytes, 4096);
  EXPECT_EQ(config.small_allreduce_bytes, 0);
  EXPECT_EQ(config.spin_us, 0);
  EXPECT_EQ(config.gradient_bucket_bytes, 0);
  EXPECT_TRUE(config.exact_reduce_gradients);
  EXPECT_EQ(config.allreduce_algorithm, AllreduceAlgorithm::kRing);
  EXPECT_TRUE(config.gpu_hierarchical_allreduce);
  EXPECT_EQ(config.shared_gpu, SharedGpuPolicy::kStage);
  EXPECT_TRUE(config.dynamic_process_sets);
  EXPECT_EQ(config.cpu_kernels, "generic");
  EXPECT_TRUE(config.join_average_over_contributors);
  EXPECT_TRUE(config.stall_check);
  EXPECT_EQ(config.stall_warning_seconds, 5.0);
  EXPECT_EQ(config.stall_shutdown_seconds, 30.0);
  EXPECT_EQ(config.timeline_path, "/tmp/timeline.json");
  EXPECT_TRUE(config.timeline_mark_cycles);
  EXPECT_EQ(config.timeline_queue_events, 10);
  EXPECT_EQ(config.hostname, "node7");
  EXPECT_EQ(config.log_level, LogLevel::kDebug);
  EXPECT_TRUE(config.log_hide_time);
}

TEST(Config, StallCheckIsOffWhenDisabledOrGivenNoTime) {
  EXPECT_FALSE(Loaded({{"HORA_STALL_CHECK_DISABLE", "1"}}).stall_check);
  EXPECT_TRUE(Loaded({{"HORA_STALL_CHECK_DISABLE", "0"}}).stall_check);
  EXPECT_FALSE(Loaded({{"HORA_STALL_CHECK_TIME_SECONDS", "0"}}).stall_check);
}

TEST(Config, TheFinalizeGraceIsReadAndNeverNegative) {
  EXPECT_EQ(Loaded({}).finalize_grace_seconds, 10.0);
  EXPECT_EQ(Loaded({{"HORA_FINALIZE_GRACE_SECONDS", "2.5"}}).finalize_grace_seconds, 2.5);
  Config config;
  const Status status = LoadFrom({{"HORA_FINALIZE_GRACE_SECONDS", "-1"}}, &config);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("HORA_FINALIZE_GRACE_SECONDS='-1' is not a non-negative number"),
            std::string::npos)
      << status.message();
}

TEST(Config, TimesLongerThanAYearCountAsAYear) {
  // (in nanoseconds, 1e12 s would overflow the clocks they are compared on)
  const Config config = Loaded({{"HORA_STALL_CHECK_TIME_SECONDS", "1e12"},
                                {"HORA_STALL_SHUTDOWN_TIME_SECONDS", "1e300"},
                                {"HORA_FINALIZE_GRACE_SECONDS", "1e15"}});
  EXPECT_EQ(config.stall_warning_seconds, 365.0 * 24 * 3600);
  EXPECT_EQ(config.stall_shutdown_seconds, 365.0 * 24 * 3600);
  EXPECT_EQ(config.finalize_grace_seconds, 365.0 * 24 * 3600);
  EXPECT_TRUE(config.stall_check);
}

TEST(Config, AcceptsTheHorovodAliases) {
  const Config config = Loaded({
      {"HOROVOD_FUSION_THRESHOLD", "2048"},
      {"HOROVOD_CYCLE_TIME", "1.5"},
      {"HOROVOD_CACHE_CAPACITY", "16"},
      {"HOROVOD_AUTOTUNE", "1"},
      {"HOROVOD_AUTOTUNE_LOG", "tune.csv"},
      {"HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "2"},
      {"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"},
      {"HOROVOD_DYNAMIC_PROCESS_SETS", "1"},
      {"HOROVOD_STALL_CHECK_TIME_SECONDS", "7"},
      {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "70"},
      {"HOROVOD_TIMELINE", "hvd.json"},
      {"HOROVOD_TIMELINE_MARK_CYCLES", "1"},
      {"HOROVOD_LOG_LEVEL", "error"},
      {"HOROVOD_LOG_HIDE_TIME", "1"},
  });
  EXPECT_EQ(config.fusion_threshold_bytes, 2048);
  EXPECT_TRUE(config.fusion_threshold_explicit);
  EXPECT_EQ(config.cycle_time_ms, 1.5);
  EXPECT_TRUE(config.cycle_time_explicit);
  EXPECT_EQ(config.cache_capacity, 16);
  EXPECT_TRUE(config.cache_capacity_explicit);
  EXPECT_TRUE(config.autotune);
  EXPECT_EQ(config.autotune_log, "tune.csv");
  EXPECT_EQ(config.autotune_warmup_samples, 2);
  EXPECT_TRUE(config.gpu_hierarchical_allreduce);
  EXPECT_TRUE(config.dynamic_process_sets);
  EXPECT_EQ(config.stall_warning_seconds, 7.0);
  EXPECT_EQ(config.stall_shutdown_seconds, 70.0);
  EXPECT_EQ(config.timeline_path, "hvd.json");
  EXPECT_TRUE(config.timeline_mark_cycles);
  EXPECT_EQ(config.log_level, LogLevel::kError);
  EXPECT_TRUE(config.log_hide_time);
  EXPECT_FALSE(Loaded({{"HOROVOD_STALL_CHECK_DISABLE", "1"}}).stall_check);
}

TEST(Config, TheHoraNameWinsOverItsAlias) {
  const Config config = Loaded({
      {"HORA_FUSION_THRESHOLD_BYTES", "100"},
      {"HOROVOD_FUSION_THRESHOLD", "200"},
      {"HORA_CYCLE_TIME_MS", "3"},
      {"HOROVOD_CYCLE_TIME", "4"},
      {"HORA_CACHE_CAPACITY", "5"},
      {"HOROVOD_CACHE_CAPACITY", "6"},
      {"HORA_TIMELINE", "hora.json"},
      {"HOROVOD_TIMELINE", "hvd.json"},
      {"HORA_LOG_LEVEL", "info"},
      {"HOROVOD_LOG_LEVEL", "trace"},
      {"HORA_AUTOTUNE", "0"},
      {"HOROVOD_AUTOTUNE", "1"},
  });
  EXPECT_EQ(config.fusion_threshold_bytes, 100);
  EXPECT_EQ(config.cycle_time_ms, 3.0);
  EXPECT_EQ(config.cache_capacity, 5);
  EXPECT_EQ(config.timeline_path, "hora.json");
  EXPECT_EQ(config.log_level, LogLevel::kInfo);
  EXPECT_FALSE(config.autotune);
  // A malformed alias is not even read when the HORA_ name is set.
  EXPECT_EQ(
      Loaded({{"HORA_CACHE_CAPACITY", "8"}, {"HOROVOD_CACHE_CAPACITY", "lots"}}).cache_capacity, 8);
  // An empty HORA_ value counts as unset: the alias applies.
  EXPECT_EQ(Loaded({{"HORA_CACHE_CAPACITY", ""}, {"HOROVOD_CACHE_CAPACITY", "9"}}).cache_capacity,
            9);
}

// The error Load gives for `env`; the config passed in stays as it was.
Status LoadError(const Env& env) {
  Config config;
  config.cache_capacity = 7;
  const Status status = LoadFrom(env, &config);
  EXPECT_EQ(config.cache_capacity, 7) << "a failed load leaves the config alone";
  return status;
}

TEST(Config, AMalformedValueIsAnInvalidArgumentNamingTheVariable) {
  struct Case {
    Env env;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"HORA_FUSION_THRESHOLD_BYTES", "12abc"}},
       "environment variable HORA_FUSION_THRESHOLD_BYTES='12abc' is not a non-negative integer"},
      {{{"HOROVOD_FUSION_THRESHOLD", "-1"}},
       "environment variable HOROVOD_FUSION_THRESHOLD='-1' is not a non-negative integer"},
      {{{"HORA_CACHE_CAPACITY", "1e3"}},
       "environment variable HORA_CACHE_CAPACITY='1e3' is not a non-negative integer"},
      {{{"HORA_SHM_SLOT_BYTES", "0"}},
       "environment variable HORA_SHM_SLOT_BYTES='0' is not a positive integer"},
      {{{"HORA_CYCLE_TIME_MS", "fast"}},
       "environment variable HORA_CYCLE_TIME_MS='fast' is not a non-negative number"},
      {{{"HOROVOD_CYCLE_TIME", "-2"}},
       "environment variable HOROVOD_CYCLE_TIME='-2' is not a non-negative number"},
      {{{"HORA_CYCLE_TIME_MS", "inf"}},
       "environment variable HORA_CYCLE_TIME_MS='inf' is not a non-negative number"},
      {{{"HORA_STALL_CHECK_TIME_SECONDS", "nan"}},
       "environment variable HORA_STALL_CHECK_TIME_SECONDS='nan' is not a non-negative number"},
      {{{"HORA_FUSION_THRESHOLD_BYTES", "99999999999999999999"}},
       "environment variable HORA_FUSION_THRESHOLD_BYTES='99999999999999999999' is not a "
       "non-negative integer"},
      {{{"HORA_AUTOTUNE", "maybe"}}, "environment variable HORA_AUTOTUNE='maybe' is not 1 or 0"},
      {{{"HOROVOD_HIERARCHICAL_ALLREDUCE", "on"}},
       "environment variable HOROVOD_HIERARCHICAL_ALLREDUCE='on' is not 1 or 0"},
      {{{"HORA_ALLREDUCE_ALGORITHM", "tree"}},
       "environment variable HORA_ALLREDUCE_ALGORITHM='tree' is not one of auto, mpi, ring, shm, "
       "hierarchical"},
      {{{"HORA_SHARED_GPU", "share"}},
       "environment variable HORA_SHARED_GPU='share' is not auto, stage or error"},
      {{{"HORA_CPU_KERNELS", "sse"}},
       "environment variable HORA_CPU_KERNELS='sse' is not one of auto, generic, avx2, avx512"},
      {{{"HORA_JOIN_AVERAGE", "all"}},
       "environment variable HORA_JOIN_AVERAGE='all' is not size or contributors"},
      {{{"HORA_TIMELINE_QUEUE_EVENTS", "0"}},
       "environment variable HORA_TIMELINE_QUEUE_EVENTS='0' is not a positive integer"},
      {{{"HOROVOD_LOG_LEVEL", "loud"}},
       "environment variable HOROVOD_LOG_LEVEL='loud' is not one of trace, debug, info, warning, "
       "error, fatal, off"},
  };
  for (const Case& c : cases) {
    const Status status = LoadError(c.env);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(status.message(), c.message);
  }
}

}  // namespace
}  // namespace hora
