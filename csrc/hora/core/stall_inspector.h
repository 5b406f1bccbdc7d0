#pragma once
// Rank 0's watch for collectives that some ranks submitted and others did
// not: after the warning time it logs which tensors wait on which ranks
// (and what each missing rank last submitted); after the shutdown time it
// turns the stall into an error that stops the job on every rank.
//
// Requests parked on a response-cache entry never reach the coordinator.
// The cycle therefore also ORs the ready bits; an entry that stays ready on
// some ranks but not all is pulled off the cache (as a stale entry would
// be), so its requests go to the coordinator, which knows who sent them.
#include <chrono>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hora/common/status.h"
#include "hora/core/config.h"
#include "hora/core/coordinator.h"

namespace hora {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StallInspector(const Config& config);

  // A process set's inspector: reports name ranks[r] for its rank r.
  void SetRankNames(std::vector<int> ranks) { names_ = std::move(ranks); }
  bool enabled() const { return enabled_; }
  // The cache slots that some ranks, but not all, were ready for this cycle.
  void ObservePartial(const std::vector<int64_t>& slots, Clock::time_point now);
  // Slots partially ready for long enough to send through the coordinator,
  // each with when it became partially ready.
  std::vector<std::pair<int64_t, Clock::time_point>> TakeFlush(Clock::time_point now);
  // Whether the coordinator's table is due for a look (rank 0 then makes
  // every rank negotiate this cycle).
  bool CheckDue(Clock::time_point now, const Coordinator& coordinator) const;
  // Milliseconds until something is due, or -1 when nothing is pending.
  int MsUntilDue(Clock::time_point now, const Coordinator& coordinator) const;
  // Collectives that waited past the warning time or the shutdown time,
  // whichever is shorter, for a rank that refused its call of the name for
  // being in flight there: taken off the table, as errors for every rank.
  std::vector<Response> FailRefusedAgain(Clock::time_point now, Coordinator* coordinator,
                                         const std::vector<bool>& joined) const;
  // Looks at the table: logs a warning for stalls past the warning time, and
  // returns a Timeout status (the job stops) for one past the shutdown time.
  Status Check(Clock::time_point now, const Coordinator& coordinator,
               const std::vector<bool>& joined);

 private:
  std::string Describe(const std::vector<Coordinator::Stall>& stalls,
                       const Coordinator& coordinator) const;

  bool enabled_;
  Clock::duration warning_;
  Clock::duration shutdown_;  // zero: never
  Clock::duration flush_after_;
  Clock::duration interval_;
  std::unordered_map<int64_t, Clock::time_point> partial_since_;
  Clock::time_point next_check_{};
  Clock::time_point last_warning_{};
  bool warned_ = false;
  std::vector<int> names_;  // empty: ranks are the job's
};

}  // namespace hora
