#include "hora/core/response_cache.h"

namespace hora {

ResponseCache::ResponseCache(int64_t capacity) : slots_(static_cast<size_t>(capacity)) { Clear(); }

void ResponseCache::Clear() {
  for (Slot& slot : slots_) slot = Slot();
  by_name_.clear();
  lru_.clear();
  free_.clear();
  // Hand out low slots first so the bit vector stays short in practice.
  for (int64_t slot = capacity() - 1; slot >= 0; --slot) free_.push_back(slot);
}

bool ResponseCache::Cacheable(const Request& request) {
  switch (request.kind) {
    case CollectiveKind::kAllreduce:
    case CollectiveKind::kAllgather:
    case CollectiveKind::kBroadcast:
    case CollectiveKind::kReducescatter: return true;
    default: return false;
  }
}

int64_t ResponseCache::Find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

bool ResponseCache::Matches(int64_t slot, const Request& r) const {
  const Slot& s = slots_[slot];
  if (!s.has_mine) return false;
  const Request& m = s.mine;
  return m.kind == r.kind && m.op == r.op && m.dtype == r.dtype && m.root == r.root &&
         m.prescale == r.prescale && m.postscale == r.postscale && m.shape == r.shape &&
         m.group == r.group && m.group_size == r.group_size && m.on_gpu == r.on_gpu &&
         m.members == r.members;
}

int64_t ResponseCache::Put(const Response& response, const Request* mine) {
  if (slots_.empty()) return -1;
  int64_t evicted = -1;
  if (free_.empty()) {
    evicted = lru_.back();
    Erase(evicted);
  }
  const int64_t slot = free_.back();
  free_.pop_back();
  Slot& s = slots_[slot];
  s.used = true;
  s.response = response;
  s.has_mine = mine != nullptr;
  if (mine != nullptr) s.mine = *mine;
  lru_.push_front(slot);
  s.lru_position = lru_.begin();
  by_name_[response.name] = slot;
  return evicted;
}

void ResponseCache::Touch(int64_t slot) {
  Slot& s = slots_[slot];
  lru_.splice(lru_.begin(), lru_, s.lru_position);
}

void ResponseCache::Erase(int64_t slot) {
  Slot& s = slots_[slot];
  if (!s.used) return;
  by_name_.erase(s.response.name);
  lru_.erase(s.lru_position);
  s.used = false;
  s.has_mine = false;
  free_.push_back(slot);
}

}  // namespace hora
