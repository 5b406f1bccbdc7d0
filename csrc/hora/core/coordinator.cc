#include "hora/core/coordinator.h"

#include "hora/core/response_cache.h"

#include <algorithm>
#include <functional>
#include <iomanip>
#include <sstream>

namespace hora {
namespace {

std::string FormatScale(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

// The rank messages name: the job's rank of a process set's rank (`names`
// empty: the same number).
int NameOf(const std::vector<int>& names, int rank) {
  return names.empty() || rank < 0 || rank >= static_cast<int>(names.size()) ? rank : names[rank];
}

// "ranks 0, 2 sent [2, 3]; rank 1 sent [4]": every distinct value with the
// ranks that sent it, so the user sees both sides of a disagreement.
std::string DescribeValues(const std::vector<std::pair<int, std::string>>& values,
                           const std::vector<int>& names) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& item : values) {
    bool found = false;
    for (auto& g : groups) {
      if (g.first == item.second) {
        g.second.push_back(item.first);
        found = true;
        break;
      }
    }
    if (!found) groups.push_back({item.second, {item.first}});
  }
  std::ostringstream s;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i) s << "; ";
    s << (groups[i].second.size() > 1 ? "ranks " : "rank ");
    for (size_t j = 0; j < groups[i].second.size(); ++j) {
      s << (j ? ", " : "") << NameOf(names, groups[i].second[j]);
    }
    s << " sent " << groups[i].first;
  }
  return s.str();
}

// ", submitted at: rank 0 train.py:42 in step; rank 1 ..." when the ranks
// recorded where they submitted (debug log level), else "".
std::string CallSites(const std::vector<Request>& by_rank, const std::vector<bool>& have,
                      const std::vector<int>& names) {
  std::ostringstream s;
  bool any = false;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    if (!have[r] || by_rank[r].site.empty()) continue;
    s << (any ? "; " : "\n  submitted at: ") << "rank " << NameOf(names, static_cast<int>(r)) << " "
      << by_rank[r].site;
    any = true;
  }
  return s.str();
}

// "rank 1" / "ranks 0, 2", in the job's numbering.
std::string RankList(const std::vector<int>& ranks, const std::vector<int>& names) {
  std::ostringstream s;
  s << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) s << (i ? ", " : "") << NameOf(names, ranks[i]);
  return s.str();
}

}  // namespace

void Coordinator::Note(const Request& note) {
  if (note.rank < 0 || note.rank >= size_) return;
  if (note.note == RequestNote::kRefusedAgain) {
    std::vector<bool>& ranks = refused_again_[note.name];
    if (ranks.empty()) ranks.assign(size_, false);
    ranks[note.rank] = true;
  } else if (note.note == RequestNote::kCalledAgain) {
    auto it = refused_again_.find(note.name);
    if (it == refused_again_.end()) return;
    it->second[note.rank] = false;
    if (std::none_of(it->second.begin(), it->second.end(), [](bool b) { return b; })) {
      refused_again_.erase(it);
    }
  }
}

std::vector<Response> Coordinator::TakeRefusedAgain(Clock::time_point now, Clock::duration older,
                                                    const std::vector<bool>& joined,
                                                    const std::string& waited_for) {
  std::vector<Response> failed;
  if (refused_again_.empty()) return failed;
  std::unordered_map<std::string, std::string> failed_groups;  // group -> error
  std::vector<std::string> names;
  auto fail = [&](const std::string& name, CollectiveKind kind, const std::string& why) {
    Response error;
    error.name = name;
    error.kind = kind;
    error.error_code = StatusCode::kInvalidArgument;
    error.error = why;
    failed.push_back(std::move(error));
    names.push_back(name);
  };
  for (const auto& item : arrival_) {
    const std::string& name = item.second;
    const Pending& p = table_.at(name);
    if (now - p.since < older) continue;
    auto refused = refused_again_.find(name);
    if (refused == refused_again_.end()) continue;
    std::vector<int> refusing, waiting;
    for (int r = 0; r < size_; ++r) {
      if (p.have[r]) {
        waiting.push_back(r);
      } else if (!joined[r] && refused->second[r]) {
        refusing.push_back(r);
      }
    }
    if (refusing.empty()) continue;  // the refusing ranks are not the ones missing
    const Request& first = FirstRequest(p);
    std::ostringstream m;
    const bool one = refusing.size() == 1;
    m << CollectiveKindName(first.kind) << " '" << name << "'" << where_
      << " cannot complete: " << RankList(refusing, names_) << " refused a call of this name while "
      << (one ? "its" : "their") << " earlier call was still in flight there, and "
      << (one ? "has" : "have") << " not called it since; " << RankList(waiting, names_)
      << " waited " << std::fixed << std::setprecision(1)
      << std::chrono::duration<double>(now - p.since).count() << " s (" << waited_for << ") for "
      << (one ? "it" : "them")
      << ". Call a name again only after its earlier call has finished on every rank"
      << CallSites(p.by_rank, p.have, names_);
    if (!first.group.empty()) failed_groups.emplace(first.group, m.str());
    fail(name, first.kind, m.str());
    refused_again_.erase(refused);  // answered: the next call of the name starts afresh
  }
  // The rest of a failed group fails with it: its members are released
  // together or not at all.
  if (!failed_groups.empty()) {
    for (const auto& item : arrival_) {
      const Pending& p = table_.at(item.second);
      const Request& first = FirstRequest(p);
      auto group = failed_groups.find(first.group);
      if (first.group.empty() || group == failed_groups.end() ||
          std::find(names.begin(), names.end(), item.second) != names.end()) {
        continue;
      }
      fail(item.second, first.kind, group->second);
    }
  }
  for (const std::string& name : names) {
    auto it = table_.find(name);
    arrival_.erase(it->second.order);
    table_.erase(it);
  }
  return failed;
}

void Coordinator::Add(const Request& request) {
  auto it = table_.find(request.name);
  if (it == table_.end()) {
    Pending p;
    p.by_rank.resize(size_);
    p.have.assign(size_, false);
    p.order = next_order_++;
    p.since = Clock::now();
    if (!backdated_.empty()) {
      auto back = backdated_.find(request.name);
      if (back != backdated_.end()) {
        p.since = std::min(p.since, back->second);
        backdated_.erase(back);
      }
    }
    arrival_[p.order] = request.name;
    it = table_.emplace(request.name, std::move(p)).first;
  }
  it->second.by_rank[request.rank] = request;
  it->second.have[request.rank] = true;
  if (request.rank >= 0 && request.rank < size_) last_submitted_[request.rank] = request.name;
}

void Coordinator::NoteSubmittedByAll(const std::string& name) {
  for (auto& last : last_submitted_) last = name;
}

void Coordinator::Backdate(const std::string& name, Clock::time_point since) {
  auto it = table_.find(name);
  if (it != table_.end()) {
    it->second.since = std::min(it->second.since, since);
  } else {
    backdated_[name] = since;
  }
}

std::vector<Coordinator::Stall> Coordinator::Stalled(Clock::time_point now, Clock::duration older,
                                                     const std::vector<bool>& joined) const {
  std::vector<Stall> stalls;
  for (const auto& item : table_) {
    const Pending& p = item.second;
    if (now - p.since < older) continue;
    Stall stall;
    stall.name = item.first;
    stall.kind = FirstRequest(p).kind;
    stall.seconds = std::chrono::duration<double>(now - p.since).count();
    for (int r = 0; r < size_; ++r) {
      if (p.have[r]) {
        stall.have.push_back(r);
      } else if (!joined[r]) {
        stall.missing.push_back(r);
      }
    }
    // A group waiting for its last members is not stalled on any rank.
    if (stall.missing.empty()) continue;
    stalls.push_back(std::move(stall));
  }
  std::sort(stalls.begin(), stalls.end(),
            [](const Stall& a, const Stall& b) { return a.seconds > b.seconds; });
  return stalls;
}

bool Coordinator::IsComplete(const Pending& p, const std::vector<bool>& joined) const {
  for (int r = 0; r < size_; ++r) {
    if (!p.have[r] && !joined[r]) return false;
  }
  return true;
}

std::vector<Response> Coordinator::TakeReady(const std::vector<bool>& joined) {
  // Group sizes every rank declared, per group: ranks that disagree about
  // how many tensors a group has would otherwise wait forever for members
  // that never come.
  std::unordered_map<std::string, std::vector<std::pair<int, std::string>>> group_sizes;
  std::unordered_map<std::string, std::vector<bool>> group_seen;
  for (const auto& item : arrival_) {
    const Pending& p = table_.at(item.second);
    for (int r = 0; r < size_; ++r) {
      const Request& request = p.by_rank[r];
      if (!p.have[r] || request.group.empty()) continue;
      std::vector<bool>& seen = group_seen[request.group];
      if (seen.empty()) seen.assign(size_, false);
      if (seen[r]) continue;
      seen[r] = true;
      group_sizes[request.group].push_back({r, std::to_string(request.group_size)});
    }
  }
  std::unordered_map<std::string, std::string> failed_groups;
  for (auto& item : group_sizes) {
    // Decide only once every rank has sent its members (a rank submits a
    // whole group at once): an error sent earlier would miss the members
    // of the ranks still to come, which would then wait for ever.
    const std::vector<bool>& seen = group_seen[item.first];
    bool everyone = true;
    for (int r = 0; r < size_; ++r) everyone = everyone && (seen[r] || joined[r]);
    if (!everyone) continue;
    std::sort(item.second.begin(), item.second.end());
    for (const auto& value : item.second) {
      if (value.second != item.second.front().second) {
        failed_groups[item.first] = "Mismatched number of tensors in grouped collective '" +
                                    item.first.substr(item.first.find(':') + 1) +
                                    "': " + DescribeValues(item.second, names_);
        break;
      }
    }
  }

  std::unordered_map<std::string, int> complete_members;  // group -> count
  std::vector<std::string> candidates;
  for (const auto& item : arrival_) {
    const Pending& p = table_.at(item.second);
    const Request& first = FirstRequest(p);
    if (failed_groups.count(first.group) != 0) {
      candidates.push_back(item.second);
      continue;
    }
    if (!IsComplete(p, joined)) continue;
    candidates.push_back(item.second);
    if (!first.group.empty()) ++complete_members[first.group];
  }
  std::vector<Response> ready;
  for (const std::string& name : candidates) {
    auto it = table_.find(name);
    const Pending& p = it->second;
    const Request& first = FirstRequest(p);
    auto failed = failed_groups.find(first.group);
    if (failed != failed_groups.end()) {
      Response error;
      error.name = name;
      error.kind = first.kind;
      error.error_code = StatusCode::kMismatch;
      error.error = failed->second + CallSites(p.by_rank, p.have, names_);
      ready.push_back(std::move(error));
    } else if (!first.group.empty() && complete_members[first.group] < first.group_size) {
      continue;
    } else {
      ready.push_back(Decide(name, p, joined));
    }
    arrival_.erase(p.order);
    table_.erase(it);
  }
  return ready;
}

void Coordinator::CheckMembers(const std::string& name, const Request& first, const Pending& p,
                               const std::vector<int>& ranks, Response* response) const {
  if (response->is_error()) return;
  bool differ = false;
  for (int r : ranks) differ = differ || p.by_rank[r].members != first.members;
  if (!differ) return;
  std::vector<std::vector<std::vector<int64_t>>> shapes;
  for (int r : ranks) shapes.push_back(MemberShapes(p.by_rank[r].members));
  std::vector<std::pair<int, std::string>> values;
  response->error_code = StatusCode::kMismatch;
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (shapes[k].size() != shapes[0].size()) {
      for (size_t j = 0; j < ranks.size(); ++j) {
        values.push_back({ranks[j], std::to_string(shapes[j].size())});
      }
      response->error = "Mismatched number of tensors packed in allreduce '" + name + "'" + where_ +
                        ": " + DescribeValues(values, names_);
      return;
    }
  }
  size_t member = 0;
  while (member < shapes[0].size()) {
    bool same = true;
    for (const auto& rank_shapes : shapes) same = same && rank_shapes[member] == shapes[0][member];
    if (!same) break;
    ++member;
  }
  for (size_t j = 0; j < ranks.size(); ++j) {
    values.push_back({ranks[j], member < shapes[j].size() ? ShapeString(shapes[j][member]) : "?"});
  }
  response->error = "Mismatched shape of member " + std::to_string(member) + " (of " +
                    std::to_string(shapes[0].size()) + " tensors packed together) for allreduce '" +
                    name + "'" + where_ + ": " + DescribeValues(values, names_);
}

const Request& Coordinator::FirstRequest(const Pending& p) const {
  for (int r = 0; r < size_; ++r) {
    if (p.have[r]) return p.by_rank[r];
  }
  return p.by_rank[0];
}

Response Coordinator::Decide(const std::string& name, const Pending& p,
                             const std::vector<bool>& joined) const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (p.have[r]) ranks.push_back(r);
  }
  const Request& first = p.by_rank[ranks[0]];
  Response response;
  response.name = name;
  response.kind = first.kind;
  // Ranks that refused their call: every rank fails with their reasons.
  for (int r : ranks) {
    const std::string& why = p.by_rank[r].refused;
    if (why.empty()) continue;
    response.error_code = StatusCode::kInvalidArgument;
    response.error += (response.error.empty() ? "" : "; ") + std::string("rank ") +
                      std::to_string(NameOf(names_, r)) + where_ + " refused its call: " + why;
  }
  if (response.is_error()) return response;
  response.dtype = first.dtype;
  response.op = first.op;
  response.root = first.root;
  response.on_gpu = first.on_gpu;
  response.prescale = first.prescale;
  response.postscale = first.postscale;
  response.shape = first.shape;

  // Finds the first field on which the ranks disagree and turns the
  // response into an error that names the tensor, the ranks and the values.
  auto check = [&](const char* what, const std::function<std::string(const Request&)>& value) {
    if (response.is_error()) return;
    std::vector<std::pair<int, std::string>> values;
    bool differ = false;
    const std::string reference = value(first);
    for (int r : ranks) {
      values.push_back({r, value(p.by_rank[r])});
      if (values.back().second != reference) differ = true;
    }
    if (!differ) return;
    response.error_code = StatusCode::kMismatch;
    response.error = std::string("Mismatched ") + what + " for " + CollectiveKindName(first.kind) +
                     " '" + name + "'" + where_ + ": " + DescribeValues(values, names_);
  };

  check("collective kind",
        [](const Request& r) { return std::string(CollectiveKindName(r.kind)); });
  check("data type", [](const Request& r) { return std::string(DataTypeName(r.dtype)); });
  check("device", [](const Request& r) { return std::string(r.on_gpu ? "GPU" : "host memory"); });
  const CollectiveKind kind = first.kind;
  if (kind == CollectiveKind::kAllreduce || kind == CollectiveKind::kReducescatter) {
    check("reduce op", [](const Request& r) { return std::string(ReduceOpName(r.op)); });
    check("prescale factor", [](const Request& r) { return FormatScale(r.prescale); });
    check("postscale factor", [](const Request& r) { return FormatScale(r.postscale); });
  }
  if (kind == CollectiveKind::kBroadcast) {
    check("root rank", [this](const Request& r) { return std::to_string(NameOf(names_, r.root)); });
  }
  if (kind == CollectiveKind::kAllgather || kind == CollectiveKind::kAlltoall) {
    check("shape (all dimensions after the first)", [](const Request& r) {
      std::vector<int64_t> rest(r.shape.empty() ? r.shape.begin() : r.shape.begin() + 1,
                                r.shape.end());
      return std::to_string(r.shape.size()) + "-d " + ShapeString(rest);
    });
  } else if (kind == CollectiveKind::kAddProcessSet) {
    check("ranks", [](const Request& r) { return ShapeString(r.shape); });
  } else if (kind == CollectiveKind::kRemoveProcessSet) {
    check("process set id", [](const Request& r) { return ShapeString(r.shape); });
  } else if (kind != CollectiveKind::kBarrier) {
    if (kind == CollectiveKind::kAllreduce) CheckMembers(name, first, p, ranks, &response);
    check("shape", [](const Request& r) { return ShapeString(r.shape); });
  }
  check("group",
        [](const Request& r) { return r.group.empty() ? std::string("(none)") : r.group; });

  if (!response.is_error() && kind != CollectiveKind::kAllreduce) {
    std::vector<int> joined_ranks;
    for (int r = 0; r < size_; ++r) {
      if (joined[r] && !p.have[r]) joined_ranks.push_back(r);
    }
    if (!joined_ranks.empty()) {
      std::ostringstream m;
      m << CollectiveKindName(kind) << " '" << name << "' cannot run while rank"
        << (joined_ranks.size() > 1 ? "s " : " ");
      for (size_t i = 0; i < joined_ranks.size(); ++i) {
        m << (i ? ", " : "") << NameOf(names_, joined_ranks[i]);
      }
      m << (joined_ranks.size() > 1 ? " have" : " has")
        << " called join(); only allreduce accepts joined ranks";
      response.error_code = StatusCode::kMismatch;
      response.error = m.str();
    }
  }
  if (response.is_error()) {
    response.error += CallSites(p.by_rank, p.have, names_);
    return response;
  }

  response.cacheable = ResponseCache::Cacheable(first);
  response.contributors = static_cast<int32_t>(average_over_contributors_ ? ranks.size() : size_);
  if (kind == CollectiveKind::kAllgather) {
    response.first_dims.resize(size_);
    for (int r = 0; r < size_; ++r) response.first_dims[r] = p.by_rank[r].shape[0];
  } else if (kind == CollectiveKind::kAlltoall) {
    response.splits.resize(static_cast<size_t>(size_) * size_);
    for (int r = 0; r < size_; ++r) {
      for (int d = 0; d < size_; ++d) response.splits[r * size_ + d] = p.by_rank[r].splits[d];
    }
  }
  return response;
}

}  // namespace hora
