#pragma once
// One negotiation cycle, run by every rank's engine thread in lock step.
//
// Steady state costs one small allreduce: each rank sets a bit for every
// request it finds in the (identical) response cache, and the bitwise AND
// says which cached collectives every rank is ready for. Only when some rank
// has a request the cache cannot answer do the ranks fall back to sending
// requests to the coordinator on rank 0 and receiving its decisions.
//
// The same allreduce carries the or-flags (uncached work, shutdown, joined
// ranks, stale cache entries) by storing them inverted, so a cycle never
// needs a second collective just for flags. While any rank has joined, every
// request goes through the coordinator.
#include <memory>
#include <unordered_map>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/core/autotuner.h"
#include "hora/core/config.h"
#include "hora/core/coordinator.h"
#include "hora/core/message.h"
#include "hora/core/response_cache.h"
#include "hora/core/stall_inspector.h"
#include "hora/core/timeline.h"

namespace hora {

struct CycleResult {
  std::vector<Response> responses;  // run these, in this order, on every rank
  std::vector<int> shutdown_ranks;  // ranks that asked to shut down
  int joined_count = 0;             // ranks that called join()
  bool all_joined = false;          // every rank has joined: joins complete
  int last_joined_rank = -1;
  bool waiting = false;         // a caller on some rank is blocked on a result
  bool go_idle = false;         // rank 0 decided to stop back-to-back cycling
  Status abort;                 // not OK: the job stops on every rank with this error
  bool has_parameters = false;  // rank 0 announced new engine settings
  EngineParameters parameters;
};

class Controller {
 public:
  // `timeline` (rank 0's) records negotiations; it outlives the controller.
  Controller(Communicator* comm, const Config& config, Timeline* timeline);

  // `waiting`: a caller of this rank is blocked on a result. `root_idle` is
  // rank 0's say on whether the engines go back to sleep after this cycle
  // (ignored on other ranks); it comes back in go_idle. `result` is
  // cleared first, so one CycleResult may serve cycle after cycle.
  Status RunCycle(std::vector<Request> new_requests, bool shutdown, bool joined, bool waiting,
                  bool root_idle, CycleResult* result);
  // Requests that still have to reach the coordinator (e.g. moved off an
  // evicted cache entry): the engine must ask for another cycle.
  bool HasUnsentRequests() const { return !uncached_.empty(); }
  // Rank 0: milliseconds until the stall inspector needs a cycle (-1: not
  // while nothing is pending); a cycle run then lets it look.
  int MsUntilStallCheck() const;
  // A process set's controller: errors and stall reports name ranks[r] for
  // the set's rank r, and say which set (`where`).
  void SetRankNames(const std::vector<int>& ranks, const std::string& where) {
    if (coordinator_) coordinator_->SetRankNames(ranks, where);
    if (stalls_) stalls_->SetRankNames(ranks);
  }
  // Off: every request goes through the coordinator (autotuning compares).
  void SetCacheEnabled(bool enabled);
  // Rank 0: send these settings to every rank with the next cycle.
  void Announce(const EngineParameters& parameters) {
    announcement_ = parameters;
    announce_ = true;
  }

 private:
  void ClassifyNew(std::vector<Request>* new_requests, std::vector<int64_t>* invalid);
  Status Negotiate(const std::vector<bool>& joined, CycleResult* result);
  void RecordInCache(const Response& response);
  // Moves the request parked on `slot` (and the rest of its group) to the
  // coordinator path.
  void Unpark(int64_t slot);
  // Timeline (rank 0): a negotiation starts at the first sign of a tensor
  // and ends when it is decided.
  void NoteReady(const Request& request);
  void NoteDecided(const Response& response);

  Communicator* comm_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;             // rank 0 only
  std::unique_ptr<StallInspector> stalls_;               // rank 0 only
  std::unordered_map<int64_t, Request> pending_cached_;  // slot -> this rank's request
  std::vector<Request> uncached_;
  std::unordered_map<std::string, Request> awaiting_decision_;
  std::vector<bool> previous_joined_;
  Timeline* timeline_;
  bool cache_enabled_ = true;
  bool announce_ = false;  // rank 0
  EngineParameters announcement_;
  std::unordered_map<std::string, CollectiveKind> negotiating_;  // rank 0, timeline on
};

}  // namespace hora
