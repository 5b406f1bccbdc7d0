#pragma once
// Rank 0's message table. Ranks may submit collectives in any order; the
// coordinator collects every rank's request for a name and, once all ranks
// that still take part have it, checks that they agree and decides the
// response, or the error every rank will raise instead.
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "hora/core/message.h"

namespace hora {

class Coordinator {
 public:
  explicit Coordinator(int size) : size_(size) {}

  void Add(const Request& request);
  // Responses for every tensor that each rank outside `joined` has
  // submitted, in the order the tensors first arrived. Members of a group
  // come out together, once all of them are ready.
  std::vector<Response> TakeReady(const std::vector<bool>& joined);

 private:
  struct Pending {
    std::vector<Request> by_rank;
    std::vector<bool> have;
    int64_t order = 0;
  };
  bool IsComplete(const Pending& p, const std::vector<bool>& joined) const;
  const Request& FirstRequest(const Pending& p) const;
  Response Decide(const std::string& name, const Pending& p, const std::vector<bool>& joined) const;

  int size_;
  int64_t next_order_ = 0;
  std::unordered_map<std::string, Pending> table_;
  std::map<int64_t, std::string> arrival_;
};

}  // namespace hora
