#include "hora/core/process_set.h"

#include <algorithm>
#include <sstream>

namespace hora {

std::string DescribeProcessSet(int32_t id, const std::vector<int>& ranks) {
  std::ostringstream s;
  s << "process set " << id << " (rank" << (ranks.size() == 1 ? " " : "s ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << ranks[i];
  s << ")";
  return s.str();
}

std::string InvalidProcessSetRanks(const std::vector<int>& ranks, int size) {
  if (ranks.empty()) return "a process set needs at least one rank";
  std::vector<int> sorted(ranks);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= size) {
      return "rank " + std::to_string(sorted[i]) + " is outside the job's ranks 0.." +
             std::to_string(size - 1);
    }
    if (i > 0 && sorted[i] == sorted[i - 1]) {
      return "rank " + std::to_string(sorted[i]) + " is listed more than once";
    }
  }
  return std::string();
}

ProcessSet::ProcessSet(int32_t id, std::vector<int> ranks, std::unique_ptr<Communicator> comm,
                       const Config& config, Timeline* timeline, std::function<void()> on_new_work)
    : id_(id),
      ranks_(std::move(ranks)),
      comm_(std::move(comm)),
      timeline_(timeline, " [process set " + std::to_string(id) + "]"),
      queue_(std::move(on_new_work)),
      controller_(comm_.get(), config, &timeline_),
      executor_(comm_.get(), &queue_, config, &timeline_) {
  controller_.SetRankNames(ranks_, " in " + DescribeProcessSet(id_, ranks_));
}

Status ProcessSet::StartRouter(const AllreduceSettings& settings) {
  std::unique_ptr<AllreduceRouter> router;
  HORA_RETURN_IF_ERROR(AllreduceRouter::Create(comm_.get(), settings, &router));
  executor_.SetRouter(std::move(router));
  return Status::OK();
}

bool ProcessSet::HasWork() const {
  return queue_.HasNewRequests() || controller_.HasUnsentRequests() ||
         controller_.MsUntilStallCheck() == 0;
}

}  // namespace hora
