#include "hora/comm/local/local_communicator.h"

#include <algorithm>
#include <cstring>

#include "hora/comm/reduce_into.h"

namespace hora {
namespace {

// Collective traffic runs on its own tag, below every tag an algorithm
// uses; collectives are called in the same order on every rank, so one FIFO
// per pair keeps them apart.
constexpr int kCollectiveTag = -1;

}  // namespace

void LocalWorld::Send(int source, int dest, int tag, const void* data, int64_t bytes) {
  std::string message(static_cast<const char*>(data), static_cast<size_t>(bytes));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queues_[std::make_tuple(source, dest, tag)].push_back(std::move(message));
  }
  arrived_[dest].notify_all();
}

Status LocalWorld::Receive(int source, int dest, int tag, std::string* message) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::deque<std::string>& queue = queues_[std::make_tuple(source, dest, tag)];
  if (!arrived_[dest].wait_for(lock, timeout, [&] { return !queue.empty(); })) {
    return Status::Internal("local transport: rank " + std::to_string(dest) +
                            " waited in vain for a message from rank " + std::to_string(source) +
                            " (tag " + std::to_string(tag) + ")");
  }
  *message = std::move(queue.front());
  queue.pop_front();
  return Status::OK();
}

std::vector<std::unique_ptr<LocalCommunicator>> LocalCommunicator::CreateWorld(int size,
                                                                               int ranks_per_host) {
  if (ranks_per_host <= 0 || ranks_per_host > size) ranks_per_host = size;
  const int hosts = (size + ranks_per_host - 1) / ranks_per_host;
  const bool homogeneous = size % ranks_per_host == 0;
  auto world = std::make_shared<LocalWorld>(size);
  std::vector<std::shared_ptr<LocalWorld>> host_worlds, cross_worlds;
  for (int h = 0; h < hosts; ++h) {
    host_worlds.push_back(
        std::make_shared<LocalWorld>(std::min(ranks_per_host, size - h * ranks_per_host)));
  }
  for (int l = 0; l < ranks_per_host; ++l) {
    int members = 0;
    for (int r = l; r < size; r += ranks_per_host) ++members;
    cross_worlds.push_back(std::make_shared<LocalWorld>(members));
  }
  std::vector<std::unique_ptr<LocalCommunicator>> comms;
  for (int r = 0; r < size; ++r) {
    const int host = r / ranks_per_host;
    const int local_rank = r % ranks_per_host;
    Topology t;
    t.rank = r;
    t.size = size;
    t.local_rank = local_rank;
    t.local_size = host_worlds[host]->size();
    t.cross_rank = host;
    t.cross_size = cross_worlds[local_rank]->size();
    t.homogeneous = homogeneous;
    t.hostname = "host" + std::to_string(host);
    std::unique_ptr<LocalCommunicator> comm(new LocalCommunicator(world, t));
    // The parts describe themselves as communicators of their own ranks.
    Topology local_t = t;
    local_t.rank = local_rank;
    local_t.size = t.local_size;
    local_t.cross_rank = 0;
    local_t.cross_size = 1;
    comm->local_.reset(new LocalCommunicator(host_worlds[host], local_t));
    Topology cross_t = t;
    cross_t.rank = host;
    cross_t.size = t.cross_size;
    cross_t.local_rank = 0;
    cross_t.local_size = 1;
    comm->cross_.reset(new LocalCommunicator(cross_worlds[local_rank], cross_t));
    comms.push_back(std::move(comm));
  }
  return comms;
}

std::shared_ptr<LocalWorld> LocalWorld::SubWorld(uint64_t sequence, int size) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<LocalWorld>& world = sub_worlds_[sequence];
  if (!world) world = std::make_shared<LocalWorld>(size);
  return world;
}

Status LocalCommunicator::Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) {
  out->reset();
  const uint64_t sequence = splits_++;
  const auto position = std::find(ranks.begin(), ranks.end(), rank());
  if (position == ranks.end()) return Status::OK();
  Topology t;
  t.rank = static_cast<int>(position - ranks.begin());
  t.size = static_cast<int>(ranks.size());
  t.local_rank = t.rank;
  t.local_size = t.size;
  t.hostname = topology_.hostname;
  std::unique_ptr<LocalCommunicator> sub(
      new LocalCommunicator(world_->SubWorld(sequence, t.size), t));
  sub->world_->timeout = world_->timeout;
  // A set is one pretend host, as an MPI split on one host is: its local
  // part has every member (a world of its own, so that its messages never
  // meet the set's), its cross part only this rank.
  Topology local_t = t;
  local_t.cross_rank = 0;
  local_t.cross_size = 1;
  sub->local_.reset(
      new LocalCommunicator(world_->SubWorld(sequence | kLocalPart, t.size), local_t));
  sub->local_->world_->timeout = world_->timeout;
  Topology cross_t = t;
  cross_t.rank = 0;
  cross_t.size = 1;
  cross_t.local_rank = 0;
  cross_t.local_size = 1;
  sub->cross_.reset(new LocalCommunicator(std::make_shared<LocalWorld>(1), cross_t));
  *out = std::move(sub);
  return Status::OK();
}

std::string LocalCommunicator::Describe() const {
  return "local (" + std::to_string(size()) + " thread-ranks)";
}

Status LocalCommunicator::ReceiveExactly(int source, int tag, void* buffer, int64_t bytes) {
  std::string message;
  HORA_RETURN_IF_ERROR(world_->Receive(source, rank(), tag, &message));
  if (static_cast<int64_t>(message.size()) != bytes) {
    return Status::Internal("local transport: rank " + std::to_string(rank()) + " expected " +
                            std::to_string(bytes) + " bytes from rank " + std::to_string(source) +
                            " but got " + std::to_string(message.size()));
  }
  if (bytes > 0) std::memcpy(buffer, message.data(), static_cast<size_t>(bytes));
  return Status::OK();
}

Status LocalCommunicator::GatherBytes(const std::string& mine, int root,
                                      std::vector<std::string>* all) {
  if (rank() != root) {
    world_->Send(rank(), root, kCollectiveTag, mine.data(), static_cast<int64_t>(mine.size()));
    return Status::OK();
  }
  all->assign(size(), std::string());
  for (int k = 0; k < size(); ++k) {
    if (k == root) {
      (*all)[k] = mine;
    } else {
      HORA_RETURN_IF_ERROR(world_->Receive(k, root, kCollectiveTag, &(*all)[k]));
    }
  }
  return Status::OK();
}

Status LocalCommunicator::BroadcastBytes(std::string* data, int root) {
  if (rank() == root) {
    for (int k = 0; k < size(); ++k) {
      if (k != root)
        world_->Send(root, k, kCollectiveTag, data->data(), static_cast<int64_t>(data->size()));
    }
    return Status::OK();
  }
  return world_->Receive(root, rank(), kCollectiveTag, data);
}

Status LocalCommunicator::Broadcast(void* buffer, int64_t bytes, int root) {
  std::string data;
  if (rank() == root) data.assign(static_cast<const char*>(buffer), static_cast<size_t>(bytes));
  HORA_RETURN_IF_ERROR(BroadcastBytes(&data, root));
  if (rank() != root) {
    if (static_cast<int64_t>(data.size()) != bytes) {
      return Status::Internal("local transport: broadcast of " + std::to_string(bytes) +
                              " bytes got " + std::to_string(data.size()));
    }
    if (bytes > 0) std::memcpy(buffer, data.data(), static_cast<size_t>(bytes));
  }
  return Status::OK();
}

Status LocalCommunicator::Barrier() {
  std::string nothing;
  std::vector<std::string> all;
  HORA_RETURN_IF_ERROR(GatherBytes(nothing, 0, &all));
  return BroadcastBytes(&nothing, 0);
}

Status LocalCommunicator::AllreduceBitAnd(uint64_t* words, int count) {
  const int64_t bytes = static_cast<int64_t>(count) * sizeof(uint64_t);
  std::vector<std::string> all;
  HORA_RETURN_IF_ERROR(
      GatherBytes(std::string(reinterpret_cast<const char*>(words), bytes), 0, &all));
  std::string result;
  if (rank() == 0) {
    for (const std::string& other : all) {
      const uint64_t* theirs = reinterpret_cast<const uint64_t*>(other.data());
      for (int i = 0; i < count; ++i) words[i] &= theirs[i];
    }
    result.assign(reinterpret_cast<const char*>(words), bytes);
  }
  HORA_RETURN_IF_ERROR(BroadcastBytes(&result, 0));
  std::memcpy(words, result.data(), static_cast<size_t>(bytes));
  return Status::OK();
}

Status LocalCommunicator::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                    ReduceOp op) {
  const int64_t bytes = count * DataTypeSize(dtype);
  if (send != nullptr && send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes));
  std::vector<std::string> all;
  HORA_RETURN_IF_ERROR(GatherBytes(std::string(static_cast<const char*>(recv), bytes), 0, &all));
  std::string result;
  if (rank() == 0) {
    // In rank order, as a deterministic reduction would.
    result = all[0];
    for (int k = 1; k < size(); ++k) {
      HORA_RETURN_IF_ERROR(
          ReduceInto(&result[0], all[k].data(), count, dtype, op, "local transport"));
    }
  }
  HORA_RETURN_IF_ERROR(BroadcastBytes(&result, 0));
  if (bytes > 0) std::memcpy(recv, result.data(), static_cast<size_t>(bytes));
  return Status::OK();
}

Status LocalCommunicator::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                                     const std::vector<int64_t>& recv_bytes) {
  for (int k = 0; k < size(); ++k) {
    if (k != rank()) world_->Send(rank(), k, kCollectiveTag, send, send_bytes);
  }
  char* at = static_cast<char*>(recv);
  for (int k = 0; k < size(); ++k) {
    if (k == rank()) {
      if (send_bytes > 0) std::memcpy(at, send, static_cast<size_t>(send_bytes));
    } else {
      HORA_RETURN_IF_ERROR(ReceiveExactly(k, kCollectiveTag, at, recv_bytes[k]));
    }
    at += recv_bytes[k];
  }
  return Status::OK();
}

Status LocalCommunicator::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                    void* recv, const std::vector<int64_t>& recv_bytes) {
  const char* from = static_cast<const char*>(send);
  for (int k = 0; k < size(); ++k) {
    if (k != rank()) world_->Send(rank(), k, kCollectiveTag, from, send_bytes[k]);
    from += send_bytes[k];
  }
  int64_t my_send_offset = 0;
  for (int k = 0; k < rank(); ++k) my_send_offset += send_bytes[k];
  char* at = static_cast<char*>(recv);
  for (int k = 0; k < size(); ++k) {
    if (k == rank()) {
      if (recv_bytes[k] > 0) {
        std::memcpy(at, static_cast<const char*>(send) + my_send_offset,
                    static_cast<size_t>(recv_bytes[k]));
      }
    } else {
      HORA_RETURN_IF_ERROR(ReceiveExactly(k, kCollectiveTag, at, recv_bytes[k]));
    }
    at += recv_bytes[k];
  }
  return Status::OK();
}

Status LocalCommunicator::ReduceScatter(const void* send, void* recv,
                                        const std::vector<int64_t>& recv_counts, DataType dtype,
                                        ReduceOp op) {
  int64_t total = 0, offset = 0;
  for (int k = 0; k < size(); ++k) {
    if (k == rank()) offset = total;
    total += recv_counts[k];
  }
  const int64_t element = DataTypeSize(dtype);
  std::vector<char> reduced(static_cast<size_t>(total * element));
  if (total > 0) std::memcpy(reduced.data(), send, reduced.size());
  HORA_RETURN_IF_ERROR(Allreduce(nullptr, reduced.data(), total, dtype, op));
  if (recv_counts[rank()] > 0) {
    std::memcpy(recv, reduced.data() + offset * element,
                static_cast<size_t>(recv_counts[rank()] * element));
  }
  return Status::OK();
}

Status LocalCommunicator::PostSend(const void* buffer, int64_t bytes, int dest, int tag, int* id) {
  world_->Send(rank(), dest, tag, buffer, bytes);
  *id = next_id_++;
  sends_[*id] = PostedSend{buffer, std::string(static_cast<const char*>(buffer), bytes)};
  return Status::OK();
}

Status LocalCommunicator::CompleteSend(std::map<int, PostedSend>::iterator send) {
  const PostedSend posted = std::move(send->second);
  sends_.erase(send);
  if (!posted.bytes.empty() &&
      std::memcmp(posted.buffer, posted.bytes.data(), posted.bytes.size()) != 0) {
    return Status::Internal("local transport: rank " + std::to_string(rank()) +
                            " wrote to the buffer of a send before the send was complete");
  }
  return Status::OK();
}

Status LocalCommunicator::PostRecv(void* buffer, int64_t bytes, int source, int tag, int* id) {
  *id = next_id_++;
  pending_.push_back(Pending{*id, buffer, bytes, source, tag});
  return Status::OK();
}

Status LocalCommunicator::Wait(int id) {
  const auto send = sends_.find(id);
  if (send != sends_.end()) return CompleteSend(send);
  while (!pending_.empty() && pending_.front().id <= id) {
    const Pending p = pending_.front();
    pending_.pop_front();
    HORA_RETURN_IF_ERROR(ReceiveExactly(p.source, p.tag, p.buffer, p.bytes));
  }
  return Status::OK();
}

Status LocalCommunicator::WaitAll() {
  while (!pending_.empty()) HORA_RETURN_IF_ERROR(Wait(pending_.front().id));
  while (!sends_.empty()) HORA_RETURN_IF_ERROR(CompleteSend(sends_.begin()));
  return Status::OK();
}

}  // namespace hora
