#include "hora/core/process_set_table.h"

#include <algorithm>

#include "hora/common/logging.h"
#include "hora/core/engine.h"

namespace hora {
namespace {

Status UnknownSet(int32_t id) {
  return Status::InvalidArgument("there is no process set " + std::to_string(id) +
                                 " (it was removed, or never added on this process)");
}

int RankIn(const std::vector<int>& ranks, int rank) {
  const auto at = std::find(ranks.begin(), ranks.end(), rank);
  return at == ranks.end() ? -1 : static_cast<int>(at - ranks.begin());
}

}  // namespace

ProcessSetTable::ProcessSetTable(Communicator* job, const Config& config, Timeline* timeline)
    : job_(job), config_(config), timeline_(timeline) {}

ProcessSetTable::~ProcessSetTable() { Clear(); }

Status ProcessSetTable::Route(int32_t id, std::optional<int> root, ProcessSetRoute* out) const {
  if (id == 0) {
    out->engine.reset();
    out->size = job_->size();
    out->root = root.value_or(-1);
    return Status::OK();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto known = ranks_.find(id);
  if (known == ranks_.end()) return UnknownSet(id);
  const std::vector<int>& ranks = known->second;
  auto member = engines_.find(id);
  if (member == engines_.end()) {
    return Status::InvalidArgument("this process (rank " + std::to_string(job_->rank()) +
                                   ") is not in " + DescribeProcessSet(id, ranks) +
                                   "; only its members may call collectives on it");
  }
  out->root = -1;
  if (root) {
    out->root = RankIn(ranks, *root);
    if (out->root < 0) {
      return Status::InvalidArgument("root rank " + std::to_string(*root) + " is not in " +
                                     DescribeProcessSet(id, ranks) +
                                     " (root_rank is a global rank, as in Horovod)");
    }
  }
  out->engine = member->second;
  out->size = static_cast<int>(ranks.size());
  return Status::OK();
}

Status ProcessSetTable::Find(int32_t id, ProcessSetInfo* out) const {
  out->id = id;
  if (id == 0) {
    out->ranks.resize(job_->size());
    for (int r = 0; r < job_->size(); ++r) out->ranks[r] = r;
    out->rank = job_->rank();
    return Status::OK();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ranks_.find(id);
  if (it == ranks_.end()) return UnknownSet(id);
  out->ranks = it->second;
  out->rank = RankIn(out->ranks, job_->rank());
  return Status::OK();
}

std::vector<ProcessSetInfo> ProcessSetTable::All() const {
  std::vector<ProcessSetInfo> sets(1);
  Find(0, &sets[0]);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& item : ranks_) {
    ProcessSetInfo info;
    info.id = item.first;
    info.ranks = item.second;
    info.rank = RankIn(item.second, job_->rank());
    sets.push_back(std::move(info));
  }
  return sets;
}

Status ProcessSetTable::Apply(const Response& change, const EngineParameters& parameters,
                              Work* work) {
  if (change.kind == CollectiveKind::kRemoveProcessSet) {
    Remove(change, work);
    return Status::OK();
  }
  // A failure that stops the job's engine still completes the caller's
  // Work (its entry has left the queue, so stopping would not fail it).
  Status status = Add(change, parameters, work);
  if (!status.ok()) work->Complete(status);
  return status;
}

void ProcessSetTable::Remove(const Response& change, Work* work) {
  const int32_t id = change.shape.empty() ? -1 : static_cast<int32_t>(change.shape[0]);
  if (id == 0) {
    work->Complete(Status::InvalidArgument(
        "remove_process_set: the global process set (id 0) cannot be removed"));
    return;
  }
  std::shared_ptr<Engine> removed;
  std::vector<int> ranks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = ranks_.find(id);
    if (it == ranks_.end()) {
      work->Complete(UnknownSet(id).WithContext("remove_process_set"));
      return;
    }
    ranks = std::move(it->second);
    ranks_.erase(it);
    auto member = engines_.find(id);
    if (member != engines_.end()) {
      removed = std::move(member->second);
      engines_.erase(member);
    }
  }
  // Every member stops the set's engine here, at the same point of the
  // job's order; its pending collectives fail.
  if (removed) Engine::Release(std::move(removed));
  HORA_LOG(kDebug) << "removed " << DescribeProcessSet(id, ranks);
  work->Complete(Status::OK());
}

Status ProcessSetTable::Add(const Response& change, const EngineParameters& parameters,
                            Work* work) {
  std::vector<int> ranks(change.shape.begin(), change.shape.end());
  const std::string invalid = InvalidProcessSetRanks(ranks, job_->size());
  if (!invalid.empty()) {
    work->Complete(Status::InvalidArgument("add_process_set: " + invalid));
    return Status::OK();
  }
  std::sort(ranks.begin(), ranks.end());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    int32_t existing = static_cast<int>(ranks.size()) == job_->size() ? 0 : -1;
    for (const auto& item : ranks_) {
      if (item.second == ranks) existing = item.first;
    }
    if (existing >= 0) {
      work->Complete(
          Status::InvalidArgument("add_process_set: " + DescribeProcessSet(existing, ranks) +
                                  " has the same ranks; a set may exist only once"));
      return Status::OK();
    }
  }
  if (!job_->ConcurrentCalls()) {
    work->Complete(Status::InvalidArgument(
        "add_process_set: each process set runs its own engine thread, which needs MPI "
        "initialized with MPI_THREAD_MULTIPLE (hora asks for it when it initializes MPI; "
        "initialize MPI yourself with MPI_THREAD_MULTIPLE otherwise)"));
    return Status::OK();
  }
  const int32_t id = next_id_++;
  std::unique_ptr<Communicator> sub;
  HORA_RETURN_IF_ERROR(job_->Split(ranks, &sub).WithContext("add_process_set"));
  std::shared_ptr<Engine> engine;
  if (sub) {
    ProcessSetEngineOptions options;
    options.id = id;
    options.ranks = ranks;
    options.timeline = timeline_;
    options.parameters = parameters;
    std::unique_ptr<Engine> started;
    HORA_RETURN_IF_ERROR(Engine::StartProcessSet(std::move(sub), config_, options, &started)
                             .WithContext("add_process_set"));
    engine = std::move(started);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ranks_[id] = ranks;
    if (engine) engines_[id] = std::move(engine);
  }
  HORA_LOG(kDebug) << "added " << DescribeProcessSet(id, ranks);
  work->process_set_id = id;
  work->Complete(Status::OK());
  return Status::OK();
}

void ProcessSetTable::Clear() {
  std::map<int32_t, std::shared_ptr<Engine>> engines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    engines.swap(engines_);
    ranks_.clear();
  }
  for (auto& item : engines) Engine::Release(std::move(item.second));
}

void ProcessSetTable::Abort(const Status& reason) {
  std::vector<std::shared_ptr<Engine>> engines;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& item : engines_) engines.push_back(item.second);
  }
  for (const auto& engine : engines) engine->Abort(reason);
}

}  // namespace hora
