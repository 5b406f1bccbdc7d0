#pragma once
// Rank 0's message table. Ranks may submit collectives in any order; the
// coordinator collects every rank's request for a name and, once all ranks
// that still take part have it, checks that they agree and decides the
// response, or the error every rank will raise instead.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "hora/core/message.h"

namespace hora {

class Coordinator {
 public:
  // `average_over_contributors`: an Average while ranks have joined divides
  // by the ranks that submitted the tensor instead of the world size.
  explicit Coordinator(int size, bool average_over_contributors = false)
      : size_(size), average_over_contributors_(average_over_contributors), last_submitted_(size) {}

  void Add(const Request& request);
  // Responses for every tensor that each rank outside `joined` has
  // submitted, in the order the tensors first arrived. Members of a group
  // come out together, once all of them are ready.
  std::vector<Response> TakeReady(const std::vector<bool>& joined);

  using Clock = std::chrono::steady_clock;
  // For the stall inspector: a tensor that every rank submitted through the
  // response cache (so its requests never came here) ...
  void NoteSubmittedByAll(const std::string& name);
  // ... and one whose wait began before its requests got here (they sat on
  // a cache entry that only some ranks had ready).
  void Backdate(const std::string& name, Clock::time_point since);

  // A note from a rank (RequestNote): it refused a call of the name for
  // being in flight there, or it has called the name again since.
  void Note(const Request& note);
  // Takes the tensors that waited at least `older` for a rank whose call
  // of the name was refused that way (and the rest of their groups), as
  // errors for every rank; `waited_for` names the setting in the message.
  std::vector<Response> TakeRefusedAgain(Clock::time_point now, Clock::duration older,
                                         const std::vector<bool>& joined,
                                         const std::string& waited_for);

  struct Stall {
    std::string name;
    CollectiveKind kind;
    double seconds;            // how long it has waited
    std::vector<int> have;     // ranks that submitted it
    std::vector<int> missing;  // ranks (not joined) that have not
  };
  // Tensors some ranks have submitted and others not for at least `older`,
  // longest-waiting first.
  std::vector<Stall> Stalled(Clock::time_point now, Clock::duration older,
                             const std::vector<bool>& joined) const;
  bool HasPending() const { return !table_.empty(); }
  // The last tensor each rank was seen to submit ("" if none yet).
  const std::string& LastSubmitted(int rank) const { return last_submitted_[rank]; }
  // A process set's coordinator: messages name ranks[r] for its rank r and
  // say which set (`where`, e.g. " in process set 2").
  void SetRankNames(std::vector<int> ranks, std::string where) {
    names_ = std::move(ranks);
    where_ = std::move(where);
  }

 private:
  struct Pending {
    std::vector<Request> by_rank;
    std::vector<bool> have;
    int64_t order = 0;
    Clock::time_point since;
  };
  bool IsComplete(const Pending& p, const std::vector<bool>& joined) const;
  const Request& FirstRequest(const Pending& p) const;
  // Turns `response` into an error naming the first member whose shape the
  // ranks of a packed allreduce disagree on (or their member counts).
  void CheckMembers(const std::string& name, const Request& first, const Pending& p,
                    const std::vector<int>& ranks, Response* response) const;
  Response Decide(const std::string& name, const Pending& p, const std::vector<bool>& joined) const;

  int size_;
  bool average_over_contributors_;
  int64_t next_order_ = 0;
  std::unordered_map<std::string, Pending> table_;
  std::map<int64_t, std::string> arrival_;
  std::vector<std::string> last_submitted_;
  std::vector<int> names_;  // empty: ranks are the job's
  std::string where_;
  std::unordered_map<std::string, Clock::time_point> backdated_;
  // name -> the ranks whose call of it was refused for being in flight
  // there, and who have not called it again since
  std::unordered_map<std::string, std::vector<bool>> refused_again_;
};

}  // namespace hora
