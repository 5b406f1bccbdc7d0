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

}  // namespace hora
