#include "hora/core/controller.h"

#include <algorithm>
#include <cctype>

#include "hora/common/logging.h"

namespace hora {
namespace {

constexpr uint64_t kFlagUncached = 1;
constexpr uint64_t kFlagWaiting = 2;   // a caller on this rank waits for a result
constexpr uint64_t kFlagRootIdle = 4;  // set by rank 0 only

int64_t Words(int64_t bits) { return (bits + 63) / 64; }
void SetBit(uint64_t* words, int64_t bit) { words[bit / 64] |= uint64_t(1) << (bit % 64); }
bool GetBit(const uint64_t* words, int64_t bit) { return (words[bit / 64] >> (bit % 64)) & 1; }

// Calls fn(bit) for every set bit of the `count`-word vector made by
// combine(word index): cycles run back to back, and walking every one of a
// thousand cache slots each time would cost more than the exchange itself.
template <typename Combine, typename Fn>
void ForEachBit(int64_t count, Combine combine, Fn fn) {
  for (int64_t w = 0; w < count; ++w) {
    uint64_t word = combine(w);
    while (word != 0) {
      const int bit = __builtin_ctzll(word);
      word &= word - 1;
      fn(w * 64 + bit);
    }
  }
}

}  // namespace

Controller::Controller(Communicator* comm, const Config& config, Timeline* timeline)
    : comm_(comm),
      cache_(config.cache_capacity),
      previous_joined_(comm->size(), false),
      timeline_(timeline) {
  if (comm_->rank() == 0) {
    coordinator_.reset(new Coordinator(comm_->size(), config.join_average_over_contributors));
    stalls_.reset(new StallInspector(config));
  }
}

static std::string NegotiateActivity(CollectiveKind kind) {
  std::string name = std::string("NEGOTIATE_") + CollectiveKindName(kind);
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

void Controller::NoteReady(const Request& request) {
  if (!timeline_->active()) return;
  if (negotiating_.emplace(request.name, request.kind).second) {
    timeline_->Begin(request.name, NegotiateActivity(request.kind));
  }
  timeline_->Instant(request.name, "rank " + std::to_string(request.rank) + " ready",
                     "{\"rank\": " + std::to_string(request.rank) + "}");
}

void Controller::NoteDecided(const Response& response) {
  auto it = negotiating_.find(response.name);
  if (it == negotiating_.end()) return;
  timeline_->End(response.name, NegotiateActivity(it->second));
  negotiating_.erase(it);
}

void Controller::SetCacheEnabled(bool enabled) {
  if (enabled == cache_enabled_) return;
  cache_enabled_ = enabled;
  if (!enabled) {
    for (auto& item : pending_cached_) uncached_.push_back(std::move(item.second));
    pending_cached_.clear();
  } else {
    // Requests sent to the coordinator while the cache was off may still be
    // waiting there; a rank whose copy of such a tensor now hit the cache
    // would never meet them. Starting from an empty cache avoids that.
    cache_.Clear();
  }
}

int Controller::MsUntilStallCheck() const {
  if (!stalls_) return -1;
  return stalls_->MsUntilDue(StallInspector::Clock::now(), *coordinator_);
}

void Controller::ClassifyNew(std::vector<Request>* new_requests, std::vector<int64_t>* invalid) {
  std::vector<Request>& requests = *new_requests;
  std::vector<int64_t> slots;
  size_t first = 0;
  while (first < requests.size()) {
    if (requests[first].note != RequestNote::kNone) {  // for the coordinator only
      requests[first].rank = comm_->rank();
      uncached_.push_back(std::move(requests[first]));
      ++first;
      continue;
    }
    // A group's members arrive together (one Add) and take one path
    // together: all answered by the cache, or all sent to the coordinator,
    // which releases a group only as a whole.
    size_t end = first + 1;
    if (!requests[first].group.empty()) {
      while (end < requests.size() && requests[end].group == requests[first].group) ++end;
    }
    slots.assign(end - first, -1);
    bool all_hit = true;
    for (size_t k = first; k < end; ++k) {
      Request& request = requests[k];
      request.rank = comm_->rank();
      const bool refused = !request.refused.empty();
      const int64_t slot = cache_enabled_ && (refused || ResponseCache::Cacheable(request))
                               ? cache_.Find(request.name)
                               : -1;
      slots[k - first] = slot;
      // A refusal goes to the coordinator, and takes any cached entry of
      // its name along (the other ranks' requests must meet it there).
      const bool matches = !refused && slot >= 0 && cache_.Matches(slot, request);
      if (!matches || pending_cached_.count(slot) != 0) all_hit = false;
      // Same name, different parameters: every rank must forget the entry,
      // and the request goes to the coordinator, which will report the
      // mismatch (or accept the new parameters if all ranks changed them).
      if (slot >= 0 && !matches) invalid->push_back(slot);
    }
    for (size_t k = first; k < end; ++k) {
      if (all_hit) {
        if (coordinator_) NoteReady(requests[k]);
        pending_cached_.emplace(slots[k - first], std::move(requests[k]));
      } else {
        uncached_.push_back(std::move(requests[k]));
      }
    }
    first = end;
  }
}

void Controller::Unpark(int64_t slot) {
  auto it = pending_cached_.find(slot);
  if (it == pending_cached_.end()) return;
  const std::string group = it->second.group;
  uncached_.push_back(std::move(it->second));
  pending_cached_.erase(it);
  if (group.empty()) return;
  // The rest of its group follows it: a group never takes two paths.
  for (auto member = pending_cached_.begin(); member != pending_cached_.end();) {
    if (member->second.group == group) {
      uncached_.push_back(std::move(member->second));
      member = pending_cached_.erase(member);
    } else {
      ++member;
    }
  }
}

Status Controller::RunCycle(std::vector<Request> new_requests, bool shutdown, bool joined,
                            bool waiting, bool root_idle, CycleResult* result) {
  *result = CycleResult();  // a result handed in again holds nothing of its last cycle
  const int size = comm_->size();
  const int rank = comm_->rank();
  std::vector<int64_t> invalid;
  ClassifyNew(&new_requests, &invalid);

  const auto now = StallInspector::Clock::now();
  bool stall_check = false;
  if (stalls_ && stalls_->enabled()) {
    // Cache entries only some ranks have been ready for: pull them off the
    // cache so that the coordinator sees who sent what.
    for (const auto& item : stalls_->TakeFlush(now)) {
      if (!cache_.Occupied(item.first)) continue;
      invalid.push_back(item.first);
      coordinator_->Backdate(cache_.response(item.first).name, item.second);
    }
    stall_check = stalls_->CheckDue(now, *coordinator_);
  }

  // Layout: [~flags][ready: AND][~invalid][~any ready][~joined][~shutdown]
  const int64_t w = Words(cache_.capacity());
  const int64_t rw = Words(size);
  const int64_t ready_at = 1, invalid_at = 1 + w, any_ready_at = 1 + 2 * w, joined_at = 1 + 3 * w,
                shutdown_at = 1 + 3 * w + rw;
  std::vector<uint64_t> words(static_cast<size_t>(1 + 3 * w + 2 * rw), 0);
  words[0] = uncached_.empty() && !stall_check && !announce_ ? 0 : kFlagUncached;
  if (waiting) words[0] |= kFlagWaiting;
  if (rank == 0 && root_idle) words[0] |= kFlagRootIdle;
  for (const auto& item : pending_cached_) {
    SetBit(&words[ready_at], item.first);
    SetBit(&words[any_ready_at], item.first);
  }
  for (int64_t slot : invalid) SetBit(&words[invalid_at], slot);
  if (joined) SetBit(&words[joined_at], rank);
  if (shutdown) SetBit(&words[shutdown_at], rank);
  // Or-regions travel inverted through the AND.
  auto invert_or_regions = [&] {
    words[0] = ~words[0];
    for (size_t i = invalid_at; i < words.size(); ++i) words[i] = ~words[i];
  };
  invert_or_regions();
  HORA_RETURN_IF_ERROR(comm_->AllreduceBitAnd(words.data(), static_cast<int>(words.size())));
  invert_or_regions();
  const uint64_t flags = words[0];

  std::vector<bool> joined_ranks(size, false);
  bool joined_changed = false;
  int newly_joined_max = -1;
  for (int r = 0; r < size; ++r) {
    joined_ranks[r] = GetBit(&words[joined_at], r);
    if (joined_ranks[r] != previous_joined_[r]) joined_changed = true;
    if (joined_ranks[r] && !previous_joined_[r]) newly_joined_max = r;
    if (joined_ranks[r]) ++result->joined_count;
    if (GetBit(&words[shutdown_at], r)) result->shutdown_ranks.push_back(r);
  }

  // Stale entries are erased everywhere before anything is read from the
  // cache, and requests parked on them move to the coordinator path.
  bool any_invalid = false;
  ForEachBit(
      w, [&](int64_t i) { return words[invalid_at + i]; },
      [&](int64_t slot) {
        any_invalid = true;
        cache_.Erase(slot);
        Unpark(slot);
      });
  if (stalls_ && stalls_->enabled()) {
    std::vector<int64_t> partial;
    ForEachBit(
        w,
        [&](int64_t i) {
          return words[any_ready_at + i] & ~words[ready_at + i] & ~words[invalid_at + i];
        },
        [&](int64_t slot) { partial.push_back(slot); });
    stalls_->ObservePartial(partial, now);
  }
  if (result->joined_count > 0) {
    // While ranks are joined, only the coordinator knows who contributes
    // real data to each tensor (the Average divisor) and which collectives
    // must be refused, so the fast path steps aside.
    for (auto& item : pending_cached_) uncached_.push_back(std::move(item.second));
    pending_cached_.clear();
  } else {
    ForEachBit(
        w, [&](int64_t i) { return words[ready_at + i] & ~words[invalid_at + i]; },
        [&](int64_t slot) {
          // Every rank set this bit, so every rank had the request parked; if
          // it is gone now, a stale member of its group moved the whole group to
          // the coordinator, on every rank alike.
          if (pending_cached_.count(slot) == 0) return;
          result->responses.push_back(cache_.response(slot));
          result->responses.back().contributors = size;
          if (coordinator_) {
            coordinator_->NoteSubmittedByAll(result->responses.back().name);
            NoteDecided(result->responses.back());
          }
          cache_.Touch(slot);
          pending_cached_.erase(slot);
        });
  }

  if ((flags & kFlagUncached) || any_invalid || joined_changed || result->joined_count > 0) {
    HORA_RETURN_IF_ERROR(Negotiate(joined_ranks, result));
  }

  result->waiting = (flags & kFlagWaiting) != 0;
  result->go_idle = (flags & kFlagRootIdle) != 0;
  previous_joined_ = joined_ranks;
  if (result->joined_count == size) {
    result->all_joined = true;
    result->last_joined_rank = newly_joined_max;
    previous_joined_.assign(size, false);
  }
  return Status::OK();
}

Status Controller::Negotiate(const std::vector<bool>& joined, CycleResult* result) {
  std::vector<Response>* out = &result->responses;
  std::string mine;
  SerializeRequests(uncached_, &mine);
  for (Request& r : uncached_) {
    if (r.note != RequestNote::kNone) continue;  // nothing will be decided for it
    std::string name = r.name;
    awaiting_decision_.emplace(std::move(name), std::move(r));
  }
  uncached_.clear();

  std::vector<std::string> gathered;
  HORA_RETURN_IF_ERROR(comm_->GatherBytes(mine, 0, &gathered).WithContext("negotiation gather"));
  std::string decided;
  if (coordinator_) {
    for (const std::string& bytes : gathered) {
      std::vector<Request> requests;
      HORA_RETURN_IF_ERROR(ParseRequests(bytes, &requests));
      for (const Request& r : requests) {
        if (r.note != RequestNote::kNone) {
          coordinator_->Note(r);
          continue;
        }
        NoteReady(r);
        coordinator_->Add(r);
      }
    }
    std::vector<Response> ready = coordinator_->TakeReady(joined);
    const auto checked = StallInspector::Clock::now();
    // Collectives that wait for a rank which refused its call of the name
    // (in flight there) fail instead of stalling on.
    for (Response& refused : stalls_->FailRefusedAgain(checked, coordinator_.get(), joined)) {
      ready.push_back(std::move(refused));
    }
    for (const Response& response : ready) NoteDecided(response);
    Status stalled = stalls_->Check(checked, *coordinator_, joined);
    if (!stalled.ok()) {
      // A response without a name stops the job on every rank.
      Response stop;
      stop.error_code = stalled.code();
      stop.error = stalled.message();
      ready.push_back(std::move(stop));
    }
    if (announce_) {
      Response settings;
      settings.kind = CollectiveKind::kParameters;
      settings.shape = {announcement_.fusion_threshold_bytes,
                        static_cast<int64_t>(announcement_.cycle_time_ms * 1000.0 + 0.5),
                        announcement_.response_cache ? 1 : 0, announcement_.hierarchical ? 1 : 0};
      ready.push_back(std::move(settings));
      announce_ = false;
    }
    SerializeResponses(ready, &decided);
  }
  HORA_RETURN_IF_ERROR(comm_->BroadcastBytes(&decided, 0).WithContext("negotiation broadcast"));
  std::vector<Response> responses;
  HORA_RETURN_IF_ERROR(ParseResponses(decided, &responses));
  for (Response& response : responses) {
    if (response.name.empty() && response.is_error()) {
      result->abort = Status(response.error_code, response.error);
      continue;
    }
    if (response.kind == CollectiveKind::kParameters && response.shape.size() == 4) {
      result->has_parameters = true;
      result->parameters.fusion_threshold_bytes = response.shape[0];
      result->parameters.cycle_time_ms = static_cast<double>(response.shape[1]) / 1000.0;
      result->parameters.response_cache = response.shape[2] != 0;
      result->parameters.hierarchical = response.shape[3] != 0;
      // Switching the cache takes effect here, at the same point on every
      // rank: requests parked on it go to the coordinator from now on.
      SetCacheEnabled(result->parameters.response_cache);
      continue;
    }
    RecordInCache(response);
    out->push_back(std::move(response));
  }
  return Status::OK();
}

void Controller::RecordInCache(const Response& response) {
  auto mine = awaiting_decision_.find(response.name);
  const Request* request = mine == awaiting_decision_.end() ? nullptr : &mine->second;
  if (cache_enabled_ && response.cacheable && cache_.capacity() > 0 &&
      cache_.Find(response.name) < 0) {
    const int64_t evicted = cache_.Put(response, request);
    if (evicted >= 0) Unpark(evicted);
  }
  if (request != nullptr) awaiting_decision_.erase(mine);
}

}  // namespace hora
