#include "hora/core/autotuner.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "hora/common/logging.h"

namespace hora {
namespace {

constexpr int64_t kMiB = 1024 * 1024;
const int64_t kThresholds[] = {1 * kMiB,  2 * kMiB,  4 * kMiB,  8 * kMiB,
                               16 * kMiB, 32 * kMiB, 64 * kMiB, 128 * kMiB};
const double kCycleTimes[] = {0.0, 0.5, 1.0, 2.5, 5.0};
// A sample also needs this many cycles that did work, so that a slow step
// is never judged on a fraction of itself.
constexpr int kMinCyclesPerSample = 5;

}  // namespace

Autotuner::Autotuner(const Config& config, EngineParameters initial, bool hierarchical_available)
    : active_(config.autotune),
      sample_seconds_(config.autotune_sample_seconds),
      warmup_samples_(config.autotune_warmup_samples),
      tune_threshold_(!config.fusion_threshold_explicit),
      tune_cycle_(!config.cycle_time_explicit),
      tune_cache_(!config.cache_capacity_explicit && config.cache_capacity > 0),
      tune_hierarchical_(hierarchical_available),
      current_(initial),
      best_(initial) {
  if (!active_) return;
  if (!tune_threshold_ && !tune_cycle_ && !tune_cache_ && !tune_hierarchical_) {
    HORA_LOG(kWarning) << "HORA_AUTOTUNE: every tunable setting is set explicitly, so there is "
                          "nothing to tune";
    active_ = false;
    return;
  }
  if (!config.autotune_log.empty()) {
    log_ = std::fopen(config.autotune_log.c_str(), "w");
    if (log_ == nullptr) {
      HORA_LOG(kError) << "HORA_AUTOTUNE_LOG: cannot write '" << config.autotune_log
                       << "': " << std::strerror(errno);
    } else {
      std::fprintf(log_,
                   "sample,stage,fusion_threshold_bytes,cycle_time_ms,response_cache,"
                   "hierarchical,bytes,seconds,score_bytes_per_second\n");
      std::fflush(log_);
    }
  }
  stage_ = 0;
  Plan();
  while (queue_.empty() && stage_ < 3) {
    ++stage_;
    Plan();
  }
}

Autotuner::~Autotuner() {
  if (log_ != nullptr) std::fclose(log_);
}

void Autotuner::Plan() {
  queue_.clear();
  // Warm-up samples come first (caches, page faults, first negotiations):
  // scored but not counted.
  if (results_.empty() && samples_taken_ == 0) {
    for (int w = 0; w < warmup_samples_; ++w) queue_.push_back(current_);
  }
  if (stage_ == 0 && tune_threshold_) {
    for (int64_t t : kThresholds) {
      EngineParameters p = current_;
      p.fusion_threshold_bytes = t;
      queue_.push_back(p);
    }
  } else if (stage_ == 1 && tune_cycle_) {
    for (double c : kCycleTimes) {
      EngineParameters p = best_;
      p.cycle_time_ms = c;
      queue_.push_back(p);
    }
  } else if (stage_ == 2 && (tune_cache_ || tune_hierarchical_)) {
    // The switches, each flipped from the best setting so far.
    if (tune_cache_) {
      EngineParameters p = best_;
      p.response_cache = !p.response_cache;
      queue_.push_back(p);
    }
    if (tune_hierarchical_) {
      EngineParameters p = best_;
      p.hierarchical = !p.hierarchical;
      queue_.push_back(p);
    }
    if (std::find_if(results_.begin(), results_.end(),
                     [this](const Sample& s) { return s.parameters == best_; }) == results_.end()) {
      queue_.push_back(best_);
    }
  } else if (stage_ == 3) {
    // Noise is real on a shared machine: the two best settings get one more
    // sample each, and the better mean wins.
    std::vector<Sample> ranked = results_;
    std::sort(ranked.begin(), ranked.end(),
              [](const Sample& a, const Sample& b) { return a.score > b.score; });
    for (size_t i = 0; i < ranked.size() && queue_.size() < 2; ++i) {
      if (std::find(queue_.begin(), queue_.end(), ranked[i].parameters) == queue_.end()) {
        queue_.push_back(ranked[i].parameters);
      }
    }
    confirming_ = queue_;
  }
}

void Autotuner::Record(int64_t bytes, Clock::time_point now) {
  if (!active_ || !sampling_) return;
  (void)now;
  if (bytes > 0) {
    sample_bytes_ += bytes;
    ++sample_cycles_;
  }
}

void Autotuner::Started(Clock::time_point now) {
  announced_ = false;
  sampling_ = true;
  sample_start_ = now;
  sample_bytes_ = 0;
  sample_cycles_ = 0;
}

void Autotuner::Log(const EngineParameters& p, int64_t bytes, double seconds, double score,
                    const char* stage) {
  if (log_ == nullptr) return;
  std::fprintf(log_, "%d,%s,%lld,%g,%d,%d,%lld,%.6f,%.1f\n", samples_taken_, stage,
               static_cast<long long>(p.fusion_threshold_bytes), p.cycle_time_ms,
               p.response_cache ? 1 : 0, p.hierarchical ? 1 : 0, static_cast<long long>(bytes),
               seconds, score);
  std::fflush(log_);
}

bool Autotuner::Next(Clock::time_point now, EngineParameters* next) {
  if (!active_ || announced_) return false;
  if (!sampling_) {
    // The very first setting.
    if (queue_.empty()) return false;
    *next = current_ = queue_.front();
    announced_ = true;
    return true;
  }
  const double seconds = std::chrono::duration<double>(now - sample_start_).count();
  if (seconds < sample_seconds_ || sample_cycles_ < kMinCyclesPerSample) return false;

  static const char* const kStages[] = {"fusion_threshold", "cycle_time", "switches", "confirm",
                                        "settled"};
  const double score = sample_bytes_ / seconds;
  ++samples_taken_;
  queue_.erase(queue_.begin());
  const bool warmup = samples_taken_ <= warmup_samples_;
  Log(current_, sample_bytes_, seconds, score, warmup ? "warmup" : kStages[stage_]);
  if (!warmup) {
    if (stage_ == 3) {
      for (Sample& s : results_) {
        if (s.parameters == current_) s.score = (s.score + score) / 2;
      }
    } else {
      results_.push_back({current_, score});
    }
    // Once the finalists are being re-measured, only they can win: a
    // setting measured once is as likely lucky as good.
    double best_score = -1.0;
    for (const Sample& s : results_) {
      const bool finalist = confirming_.empty() || std::find(confirming_.begin(), confirming_.end(),
                                                             s.parameters) != confirming_.end();
      if (finalist && s.score > best_score) {
        best_score = s.score;
        best_ = s.parameters;
      }
    }
  }
  while (queue_.empty() && stage_ < 4) {
    ++stage_;
    if (stage_ < 4) Plan();
  }
  if (stage_ == 4) {
    active_ = false;
    if (log_ != nullptr) {
      std::fclose(log_);
      log_ = nullptr;
    }
    HORA_LOG(kInfo) << "autotune: settled on fusion threshold " << best_.fusion_threshold_bytes
                    << " bytes, cycle time " << best_.cycle_time_ms << " ms, response cache "
                    << (best_.response_cache ? "on" : "off") << ", "
                    << (best_.hierarchical ? "hierarchical" : "flat") << " allreduce after "
                    << samples_taken_ << " samples";
    if (best_ == current_) return false;
    *next = current_ = best_;
    return true;
  }
  *next = current_ = queue_.front();
  announced_ = true;
  sampling_ = false;
  return true;
}

}  // namespace hora
