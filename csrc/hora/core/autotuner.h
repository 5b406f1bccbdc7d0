#pragma once
// Online tuning of the fusion threshold and the cycle time (HORA_AUTOTUNE=1),
// run by rank 0 while the job trains. Each setting is tried for a sample
// (HORA_AUTOTUNE_SAMPLE_SECONDS of working cycles) and scored by the bytes
// allreduced per second; the search sweeps the thresholds, then the cycle
// times around the best threshold, measures the two best settings once more,
// and keeps the winner. A setting the user gave explicitly is never changed.
//
// Rank 0 only decides; the engine announces each new setting through the
// negotiation, so every rank switches on the same cycle.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "hora/core/config.h"

namespace hora {

struct EngineParameters {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0.0;
  bool response_cache = true;  // answer repeated tensors from the cache
  bool hierarchical = true;    // several hosts: hierarchical, not a flat ring
  bool operator==(const EngineParameters& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes && cycle_time_ms == o.cycle_time_ms &&
           response_cache == o.response_cache && hierarchical == o.hierarchical;
  }
  bool operator!=(const EngineParameters& o) const { return !(*this == o); }
};

class Autotuner {
 public:
  using Clock = std::chrono::steady_clock;

  // `hierarchical_available`: the job spans hosts and "auto" could pick
  // either the hierarchical path or a flat ring.
  Autotuner(const Config& config, EngineParameters initial, bool hierarchical_available);
  ~Autotuner();

  // False once the search has settled (or when off). Any thread.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // After every cycle: the bytes it allreduced (0 for an idle cycle).
  void Record(int64_t bytes, Clock::time_point now);
  // When the current sample is over: true with the next setting to run
  // (announced to every rank, then Started() when it takes effect).
  bool Next(Clock::time_point now, EngineParameters* next);
  // The setting announced by Next() is in effect from now on.
  void Started(Clock::time_point now);

 private:
  struct Sample {
    EngineParameters parameters;
    double score = 0.0;  // bytes per second
  };
  void Plan();
  void Log(const EngineParameters& p, int64_t bytes, double seconds, double score,
           const char* stage);

  std::atomic<bool> active_;
  double sample_seconds_;
  int warmup_samples_;
  bool tune_threshold_;
  bool tune_cycle_;
  bool tune_cache_;
  bool tune_hierarchical_;
  std::vector<EngineParameters> queue_;  // settings still to try in this stage
  std::vector<Sample> results_;
  std::vector<EngineParameters> confirming_;  // the finalists (stage 2)
  int stage_ = 0;  // 0 thresholds, 1 cycle times, 2 switches, 3 re-measure, 4 settled
  EngineParameters current_;
  EngineParameters best_;
  bool sampling_ = false;
  bool announced_ = false;
  Clock::time_point sample_start_;
  int64_t sample_bytes_ = 0;
  int sample_cycles_ = 0;
  int samples_taken_ = 0;
  std::FILE* log_ = nullptr;
};

}  // namespace hora
