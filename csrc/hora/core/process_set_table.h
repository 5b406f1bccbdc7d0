#pragma once
// The job's process sets as every rank knows them, and the engines of the
// sets this rank belongs to. The job's engine owns one table; callers
// consult it once per submission (Route), and its engine thread changes it
// (Apply) at the same point of the job's order on every rank, so every rank
// gives a new set the same id.
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/common/status.h"
#include "hora/core/autotuner.h"
#include "hora/core/config.h"
#include "hora/core/message.h"
#include "hora/core/process_set.h"
#include "hora/core/timeline.h"
#include "hora/core/work.h"

namespace hora {

class Engine;  // hora/core/engine.h: a set's engine is an Engine of its own

struct ProcessSetInfo {
  int32_t id = 0;
  std::vector<int> ranks;  // the job's ranks; the set's rank k is ranks[k]
  int rank = -1;           // this rank's rank in the set, -1 when not a member
};

// Where one submission goes: what a collective on the set needs to know.
struct ProcessSetRoute {
  std::shared_ptr<Engine> engine;  // the set's engine; null for the global set
  int size = 0;                    // the set's number of ranks
  int root = -1;                   // the broadcast root as the set's rank, else -1
};

class ProcessSetTable {
 public:
  // `job` is the job's communicator (sets are split from it); `config` and
  // `timeline` are the job's, which the sets' engines start from.
  ProcessSetTable(Communicator* job, const Config& config, Timeline* timeline);
  ~ProcessSetTable();

  // The one lookup of a submission to set `id`. `root` (a job rank, for
  // collectives that have one) comes back as the set's rank. Errors name
  // the set and say why: unknown id, this rank not a member, a root
  // outside the set.
  Status Route(int32_t id, std::optional<int> root, ProcessSetRoute* out) const;
  // InvalidArgument naming the id when there is no such set.
  Status Find(int32_t id, ProcessSetInfo* out) const;
  std::vector<ProcessSetInfo> All() const;

  // Engine thread of the job: runs an add/remove-process-set response and
  // completes `work` with its outcome (the new id, or the error every rank
  // raises). `parameters` are the job's settings now, which a new set's
  // engine starts with. A returned error (a transport failure) stops the
  // job's engine; `work` is completed with it too.
  Status Apply(const Response& change, const EngineParameters& parameters, Work* work);
  // Stops the engines of this rank's sets (each tells its members) and
  // forgets every set. Idempotent.
  void Clear();
  // Engine::Abort on the engines of this rank's sets.
  void Abort(const Status& reason);

 private:
  Status Add(const Response& change, const EngineParameters& parameters, Work* work);
  void Remove(const Response& change, Work* work);

  Communicator* job_;
  Config config_;
  Timeline* timeline_;
  mutable std::mutex mutex_;
  // Every set but the global one, and the engines of those this rank is in.
  // Callers read them under mutex_; only the job's engine thread changes them.
  std::map<int32_t, std::vector<int>> ranks_;
  std::map<int32_t, std::shared_ptr<Engine>> engines_;
  int32_t next_id_ = 1;  // engine thread only
};

}  // namespace hora
