#include "hora/common/collective_watch.h"

#include <algorithm>
#include <cstdio>

#include "hora/common/logging.h"

namespace hora {
namespace {

std::mutex& RegistryMutex() {
  static std::mutex* mutex = new std::mutex();
  return *mutex;
}

std::vector<CollectiveWatch*>& Registry() {
  static auto* all = new std::vector<CollectiveWatch*>();
  return *all;
}

std::string Seconds(CollectiveWatch::Clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

std::string Bytes(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 20)) {
    std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  } else {
    std::snprintf(text, sizeof(text), "%lld bytes", static_cast<long long>(bytes));
  }
  return text;
}

}  // namespace

CollectiveWatch::CollectiveWatch() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().push_back(this);
}

CollectiveWatch::~CollectiveWatch() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto& all = Registry();
  all.erase(std::remove(all.begin(), all.end(), this), all.end());
}

void CollectiveWatch::Begin(const char* kind, const std::string* name, size_t more, int64_t bytes) {
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  running_ = true;
  reported_ = false;
  since_ = now;
  kind_ = kind;
  name_ = name;
  more_ = more;
  bytes_ = bytes;
}

void CollectiveWatch::End() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (reported_ && !abandoned_) {
    HORA_LOG(kWarning) << DescribeLocked() << " ended after " << Seconds(Clock::now() - since_);
  }
  running_ = false;
  reported_ = false;
  name_ = nullptr;
}

void CollectiveWatch::Abandon() {
  std::lock_guard<std::mutex> lock(mutex_);
  abandoned_ = true;
}

std::string CollectiveWatch::DescribeLocked() const {
  std::string text = std::string(kind_) + " '" + (name_ ? *name_ : std::string()) + "'";
  if (more_ > 0) text += " (fused with " + std::to_string(more_) + " more)";
  return text + " of " + Bytes(bytes_);
}

std::vector<std::string> CollectiveWatch::Overdue(Clock::time_point now, Clock::duration after) {
  std::vector<std::string> found;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (CollectiveWatch* watch : Registry()) {
    std::lock_guard<std::mutex> hold(watch->mutex_);
    if (!watch->running_ || watch->reported_ || watch->abandoned_ || now - watch->since_ < after)
      continue;
    watch->reported_ = true;
    found.push_back(watch->DescribeLocked() + " has been running on this rank for " +
                    Seconds(now - watch->since_) +
                    "; the processes are alive (the heartbeat names one that stops), so unless "
                    "the transfer is this slow, the transport waits for data that does not come: "
                    "a network path between the hosts that drops it (a firewall, an MTU "
                    "mismatch, an interface the other hosts cannot reach) or a stalled "
                    "transport library");
  }
  return found;
}

}  // namespace hora
