#include "hora/core/stall_inspector.h"

#include <algorithm>
#include <sstream>

#include "hora/common/logging.h"

namespace hora {
namespace {

using Seconds = std::chrono::duration<double>;

StallInspector::Clock::duration FromSeconds(double seconds) {
  return std::chrono::duration_cast<StallInspector::Clock::duration>(Seconds(seconds));
}

std::string Ranks(std::vector<int> ranks, const std::vector<int>& names) {
  if (!names.empty()) {
    for (int& r : ranks) r = r >= 0 && r < static_cast<int>(names.size()) ? names[r] : r;
  }
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  const size_t shown = std::min<size_t>(ranks.size(), 16);
  for (size_t i = 0; i < shown; ++i) s << (i ? ", " : "") << ranks[i];
  if (shown < ranks.size()) s << " and " << ranks.size() - shown << " more";
  return s.str();
}

std::string Round(double seconds) {
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(1);
  s << seconds << " s";
  return s.str();
}

}  // namespace

StallInspector::StallInspector(const Config& config)
    : enabled_(config.stall_check || config.stall_shutdown_seconds > 0),
      warning_(FromSeconds(config.stall_check ? config.stall_warning_seconds : 0.0)),
      shutdown_(FromSeconds(config.stall_shutdown_seconds)) {
  // The shorter of the two times decides how soon a stall must be seen.
  double first = config.stall_check ? config.stall_warning_seconds : config.stall_shutdown_seconds;
  if (config.stall_shutdown_seconds > 0) first = std::min(first, config.stall_shutdown_seconds);
  flush_after_ = FromSeconds(std::min(1.0, first / 2));
  interval_ = FromSeconds(std::max(0.05, std::min(1.0, first / 8)));
}

void StallInspector::ObservePartial(const std::vector<int64_t>& slots, Clock::time_point now) {
  if (!enabled_ || (slots.empty() && partial_since_.empty())) return;  // the usual cycle
  std::unordered_map<int64_t, Clock::time_point> still;
  for (int64_t slot : slots) {
    auto it = partial_since_.find(slot);
    still[slot] = it == partial_since_.end() ? now : it->second;
  }
  partial_since_.swap(still);
}

std::vector<std::pair<int64_t, StallInspector::Clock::time_point>> StallInspector::TakeFlush(
    Clock::time_point now) {
  std::vector<std::pair<int64_t, Clock::time_point>> flush;
  for (auto it = partial_since_.begin(); it != partial_since_.end();) {
    if (now - it->second >= flush_after_) {
      flush.push_back(*it);
      it = partial_since_.erase(it);
    } else {
      ++it;
    }
  }
  return flush;
}

bool StallInspector::CheckDue(Clock::time_point now, const Coordinator& coordinator) const {
  return enabled_ && coordinator.HasPending() && now >= next_check_;
}

int StallInspector::MsUntilDue(Clock::time_point now, const Coordinator& coordinator) const {
  if (!enabled_) return -1;
  Clock::time_point due = Clock::time_point::max();
  if (coordinator.HasPending()) due = std::max(now, next_check_);
  for (const auto& item : partial_since_) due = std::min(due, item.second + flush_after_);
  if (due == Clock::time_point::max()) return -1;
  if (due <= now) return 0;
  // Rounded up, so that a wait of this long finds it due.
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(due - now).count();
  return static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

std::string StallInspector::Describe(const std::vector<Coordinator::Stall>& stalls,
                                     const Coordinator& coordinator) const {
  std::ostringstream s;
  const size_t shown = std::min<size_t>(stalls.size(), 10);
  for (size_t i = 0; i < shown; ++i) {
    const Coordinator::Stall& stall = stalls[i];
    s << "\n  " << CollectiveKindName(stall.kind) << " '" << stall.name << "' waited "
      << Round(stall.seconds) << ": submitted by " << Ranks(stall.have, names_) << ", not by "
      << Ranks(stall.missing, names_) << " (last submitted: ";
    for (size_t j = 0; j < stall.missing.size() && j < 4; ++j) {
      const std::string& last = coordinator.LastSubmitted(stall.missing[j]);
      const int missing = stall.missing[j];
      s << (j ? ", " : "") << "rank "
        << (names_.empty() || missing >= static_cast<int>(names_.size()) ? missing
                                                                         : names_[missing])
        << " '" << (last.empty() ? "nothing yet" : last) << "'";
    }
    if (stall.missing.size() > 4) s << ", ...";
    s << ")";
  }
  if (shown < stalls.size()) s << "\n  and " << stalls.size() - shown << " more";
  return s.str();
}

std::vector<Response> StallInspector::FailRefusedAgain(Clock::time_point now,
                                                       Coordinator* coordinator,
                                                       const std::vector<bool>& joined) const {
  if (!enabled_) return {};
  // The shorter of the two times: a refusal explains the wait better than
  // the stall shutdown would.
  const bool warns = warning_ > Clock::duration::zero() &&
                     (shutdown_ == Clock::duration::zero() || warning_ <= shutdown_);
  return coordinator->TakeRefusedAgain(
      now, warns ? warning_ : shutdown_, joined,
      warns ? "HORA_STALL_CHECK_TIME_SECONDS" : "HORA_STALL_SHUTDOWN_TIME_SECONDS");
}

Status StallInspector::Check(Clock::time_point now, const Coordinator& coordinator,
                             const std::vector<bool>& joined) {
  if (!enabled_) return Status::OK();
  next_check_ = now + interval_;
  const char* hint =
      "\nA rank may have skipped a collective, submitted them in another order or under other "
      "names, or be stuck (or slow) outside hora.";
  if (shutdown_ > Clock::duration::zero()) {
    std::vector<Coordinator::Stall> fatal = coordinator.Stalled(now, shutdown_, joined);
    if (!fatal.empty()) {
      // The report names every collective of the hang, also those that
      // began a moment after the first (ranks that each wait for another's
      // collective started them within milliseconds of each other).
      const Clock::duration reported = warning_ > Clock::duration::zero() ? warning_ : shutdown_;
      std::string message =
          "hora stopped the job: collectives waited longer than " +
          Round(Seconds(shutdown_).count()) +
          " (HORA_STALL_SHUTDOWN_TIME_SECONDS) for some ranks:" +
          Describe(coordinator.Stalled(now, std::min(reported, shutdown_), joined), coordinator) +
          hint;
      HORA_LOG(kError) << message;
      return Status::Timeout(message);
    }
  }
  if (warning_ > Clock::duration::zero() && (!warned_ || now - last_warning_ >= warning_)) {
    std::vector<Coordinator::Stall> stalls = coordinator.Stalled(now, warning_, joined);
    if (!stalls.empty()) {
      warned_ = true;
      last_warning_ = now;
      HORA_LOG(kWarning) << "stall inspector: " << stalls.size()
                         << (stalls.size() == 1 ? " collective has" : " collectives have")
                         << " waited more than " << Round(Seconds(warning_).count())
                         << " (HORA_STALL_CHECK_TIME_SECONDS) for some ranks:"
                         << Describe(stalls, coordinator) << hint
                         << (shutdown_ > Clock::duration::zero()
                                 ? ""
                                 : " Set HORA_STALL_SHUTDOWN_TIME_SECONDS to stop the job "
                                   "instead of waiting.");
    }
  }
  return Status::OK();
}

}  // namespace hora
