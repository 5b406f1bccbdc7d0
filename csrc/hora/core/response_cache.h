#pragma once
// Remembers the responses of collectives that already ran, so that in steady
// state (the same gradients every step) ranks agree on what is ready through
// one bit-vector allreduce instead of a round trip through the coordinator.
//
// Every rank holds an identical cache: entries are added, used and evicted
// only as a consequence of the response lists that all ranks process in the
// same order, so a slot number means the same tensor everywhere.
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "hora/core/message.h"

namespace hora {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity);

  int64_t capacity() const { return static_cast<int64_t>(slots_.size()); }
  static bool Cacheable(const Request& request);

  // Slot holding `name`, or -1.
  int64_t Find(const std::string& name) const;
  const Response& response(int64_t slot) const { return slots_[slot].response; }
  bool Occupied(int64_t slot) const { return slots_[slot].used; }
  // True when this rank's new request asks for exactly what it asked for
  // when the entry was made.
  bool Matches(int64_t slot, const Request& request) const;
  // Adds an entry; `mine` is this rank's request, or nullptr for a rank
  // that did not submit it (a joined rank). Returns the slot it evicted to
  // make room, or -1.
  int64_t Put(const Response& response, const Request* mine);
  void Touch(int64_t slot);
  void Erase(int64_t slot);
  // Forgets every entry (on every rank at the same point).
  void Clear();

 private:
  struct Slot {
    bool used = false;
    bool has_mine = false;
    Response response;
    Request mine;
    std::list<int64_t>::iterator lru_position;
  };
  std::vector<Slot> slots_;
  std::unordered_map<std::string, int64_t> by_name_;
  std::list<int64_t> lru_;  // front: most recently used
  std::vector<int64_t> free_;
};

}  // namespace hora
