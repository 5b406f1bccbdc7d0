#include "hora/comm/tcp/tcp_communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>

#include "hora/comm/reduce_into.h"
#include "hora/comm/tcp/sockets.h"
#include "hora/comm/tcp/tcp_rendezvous.h"

namespace hora {
namespace {

// Collective traffic runs on its own tag, below every tag an algorithm
// uses; collectives are called in the same order on every rank of a
// communicator, so one FIFO per pair keeps them apart.
constexpr int kCollectiveTag = -1;
constexpr uint64_t kWorldContext = 1;
// Below this many bytes an allreduce exchanges whole buffers by recursive
// doubling (one message's latency per doubling); above it, it goes around
// the ring (bandwidth).
constexpr int64_t kRingMinBytes = 64 * 1024;

// A communicator's context from its parent's and the split that made it:
// the same on every member, and unlike any other in practice.
uint64_t ChildContext(uint64_t parent, uint64_t split, uint64_t part) {
  uint64_t z = parent ^ (split * 0x9E3779B97F4A7C15ULL) ^ (part << 56);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  z ^= z >> 31;
  return z <= kWorldContext ? z + 2 : z;
}

// The first element of chunk `i` when `count` elements are cut into `n`
// near-equal chunks.
int64_t ChunkStart(int64_t count, int n, int i) {
  const int64_t base = count / n, extra = count % n;
  return base * i + std::min<int64_t>(i, extra);
}

}  // namespace

TcpCommunicator::TcpCommunicator(std::shared_ptr<TcpFabric> fabric, uint64_t context,
                                 std::vector<int> members)
    : fabric_(std::move(fabric)), context_(context), members_(std::move(members)) {}

TcpCommunicator::~TcpCommunicator() {
  for (auto& entry : requests_) fabric_->Cancel(entry.second);
}

std::unique_ptr<TcpCommunicator> TcpCommunicator::World(std::shared_ptr<TcpFabric> fabric,
                                                        TcpRendezvous* rendezvous) {
  std::vector<int> members(fabric->size());
  for (int r = 0; r < fabric->size(); ++r) members[r] = r;
  std::unique_ptr<TcpCommunicator> world(
      new TcpCommunicator(std::move(fabric), kWorldContext, std::move(members)));
  world->rendezvous_ = rendezvous;
  world->Build(true);
  return world;
}

namespace {

// Where each rank of a world whose hosts are `hosts` (in rank order) is:
// hosts in the order of their first rank, local ranks in rank order.
struct Layout {
  std::vector<int> host_of, local_rank, host_sizes;
};

Layout LayOut(const std::vector<std::string>& hosts) {
  Layout layout;
  std::vector<std::string> order;
  for (const std::string& host : hosts) {
    const auto at = std::find(order.begin(), order.end(), host);
    const int h = static_cast<int>(at - order.begin());
    if (at == order.end()) {
      order.push_back(host);
      layout.host_sizes.push_back(0);
    }
    layout.host_of.push_back(h);
    layout.local_rank.push_back(layout.host_sizes[h]++);
  }
  return layout;
}

}  // namespace

Topology TcpTopology(const std::vector<std::string>& hosts, int rank) {
  const Layout layout = LayOut(hosts);
  Topology t;
  t.size = static_cast<int>(hosts.size());
  t.rank = rank;
  t.hostname = hosts[rank];
  t.local_rank = layout.local_rank[rank];
  t.local_size = layout.host_sizes[layout.host_of[rank]];
  t.homogeneous = std::all_of(layout.host_sizes.begin(), layout.host_sizes.end(),
                              [&](int n) { return n == layout.host_sizes[0]; });
  t.cross_size = 0;
  for (int r = 0; r < t.size; ++r) {
    if (layout.local_rank[r] != t.local_rank) continue;
    if (r == rank) t.cross_rank = t.cross_size;
    ++t.cross_size;
  }
  return t;
}

void TcpCommunicator::Build(bool with_parts) {
  std::vector<std::string> hosts;
  for (int member : members_) hosts.push_back(fabric_->hostnames()[member]);
  const int me = static_cast<int>(std::find(members_.begin(), members_.end(), fabric_->rank()) -
                                  members_.begin());
  topology_ = TcpTopology(hosts, me);
  if (!with_parts) return;
  const Layout layout = LayOut(hosts);
  std::vector<int> local_members, cross_members;
  for (size_t r = 0; r < members_.size(); ++r) {
    if (layout.host_of[r] == layout.host_of[me]) local_members.push_back(members_[r]);
    if (layout.local_rank[r] == layout.local_rank[me]) cross_members.push_back(members_[r]);
  }
  local_.reset(new TcpCommunicator(fabric_, ChildContext(context_, 0, 1), local_members));
  local_->Build(false);
  cross_.reset(new TcpCommunicator(fabric_, ChildContext(context_, 0, 2), cross_members));
  cross_->Build(false);
}

Status TcpCommunicator::CreateLoopbackWorld(int size, int ranks_per_host,
                                            std::vector<std::unique_ptr<TcpCommunicator>>* out) {
  out->clear();
  std::random_device random;
  const uint64_t cookie = (static_cast<uint64_t>(random()) << 32) ^ random();
  std::vector<TcpWorldSpec> specs(size);
  std::vector<TcpPeer> peers(size);
  for (int r = 0; r < size; ++r) {
    int port = 0;
    HORA_RETURN_IF_ERROR(sockets::Listen(size, &specs[r].listen_fd, &port));
    peers[r].hostname = ranks_per_host > 0 ? "host" + std::to_string(r / ranks_per_host) : "host0";
    peers[r].addresses = {"127.0.0.1"};
    peers[r].port = port;
  }
  std::vector<std::shared_ptr<TcpFabric>> fabrics(size);
  std::vector<Status> results(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    specs[r].rank = r;
    specs[r].peers = peers;
    specs[r].cookie = cookie;
    specs[r].timeout = std::chrono::milliseconds(30000);
    threads.emplace_back([&, r] { results[r] = TcpFabric::Connect(specs[r], &fabrics[r]); });
  }
  for (std::thread& thread : threads) thread.join();
  for (int r = 0; r < size; ++r) {
    HORA_RETURN_IF_ERROR(results[r].WithContext("rank " + std::to_string(r)));
  }
  for (int r = 0; r < size; ++r) out->push_back(World(fabrics[r]));
  return Status::OK();
}

std::string TcpCommunicator::Describe() const {
  return "TCP (hora's own transport, " + std::to_string(size()) + " processes)";
}

Status TcpCommunicator::WaitEach(std::vector<std::shared_ptr<TcpFabric::Request>>* requests) {
  const Status status = fabric_->WaitAll(*requests);
  requests->clear();
  return status;
}

Status TcpCommunicator::Send(const void* data, int64_t bytes, int dest) {
  return fabric_->Wait(fabric_->PostSend(context_, kCollectiveTag, data, bytes, members_[dest]));
}

Status TcpCommunicator::Recv(void* data, int64_t bytes, int source) {
  return fabric_->Wait(fabric_->PostRecv(context_, kCollectiveTag, data, bytes, members_[source]));
}

Status TcpCommunicator::SendRecv(const void* send, int64_t send_bytes, int dest, void* recv,
                                 int64_t recv_bytes, int source) {
  std::vector<std::shared_ptr<TcpFabric::Request>> requests{
      fabric_->PostRecv(context_, kCollectiveTag, recv, recv_bytes, members_[source]),
      fabric_->PostSend(context_, kCollectiveTag, send, send_bytes, members_[dest])};
  return WaitEach(&requests);
}

Status TcpCommunicator::GatherBytes(const std::string& mine, int root,
                                    std::vector<std::string>* all) {
  int64_t length = static_cast<int64_t>(mine.size());
  if (rank() != root) {
    HORA_RETURN_IF_ERROR(Send(&length, sizeof(length), root));
    return Send(mine.data(), length, root);
  }
  all->assign(size(), std::string());
  for (int k = 0; k < size(); ++k) {
    if (k == root) {
      (*all)[k] = mine;
      continue;
    }
    HORA_RETURN_IF_ERROR(Recv(&length, sizeof(length), k));
    (*all)[k].resize(static_cast<size_t>(length));
    HORA_RETURN_IF_ERROR(Recv(&(*all)[k][0], length, k));
  }
  return Status::OK();
}

Status TcpCommunicator::Broadcast(void* buffer, int64_t bytes, int root) {
  // Binomial tree over ranks relative to the root.
  const int n = size(), me = (rank() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (me & mask) {
      HORA_RETURN_IF_ERROR(Recv(buffer, bytes, (me - mask + root) % n));
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  std::vector<std::shared_ptr<TcpFabric::Request>> sends;
  for (; mask > 0; mask >>= 1) {
    if (me + mask < n) {
      sends.push_back(fabric_->PostSend(context_, kCollectiveTag, buffer, bytes,
                                        members_[(me + mask + root) % n]));
    }
  }
  return WaitEach(&sends);
}

Status TcpCommunicator::BroadcastBytes(std::string* data, int root) {
  int64_t length = static_cast<int64_t>(data->size());
  HORA_RETURN_IF_ERROR(Broadcast(&length, sizeof(length), root));
  if (rank() != root) data->resize(static_cast<size_t>(length));
  return Broadcast(length > 0 ? &(*data)[0] : nullptr, length, root);
}

Status TcpCommunicator::Barrier() {
  // Dissemination: after round k every rank has heard, indirectly, from
  // 2^(k+1) ranks.
  char nothing = 0, ignored = 0;
  const int n = size();
  for (int step = 1; step < n; step <<= 1) {
    HORA_RETURN_IF_ERROR(
        SendRecv(&nothing, 0, (rank() + step) % n, &ignored, 0, (rank() - step + n) % n));
  }
  return Status::OK();
}

template <typename Combine>
Status TcpCommunicator::DoublingAllreduce(void* data, int64_t bytes, Combine combine) {
  const int n = size(), me = rank();
  int doubled = 1;  // the largest power of two not above n
  while (doubled * 2 <= n) doubled *= 2;
  if (me >= doubled) {
    // Folded into a partner below, which hands the result back.
    HORA_RETURN_IF_ERROR(Send(data, bytes, me - doubled));
    return Recv(data, bytes, me - doubled);
  }
  std::vector<char> other(static_cast<size_t>(bytes));
  if (me + doubled < n) {
    HORA_RETURN_IF_ERROR(Recv(other.data(), bytes, me + doubled));
    HORA_RETURN_IF_ERROR(combine(data, other.data()));
  }
  for (int mask = 1; mask < doubled; mask <<= 1) {
    const int partner = me ^ mask;
    HORA_RETURN_IF_ERROR(SendRecv(data, bytes, partner, other.data(), bytes, partner));
    if (me < partner) {
      HORA_RETURN_IF_ERROR(combine(data, other.data()));
    } else {
      HORA_RETURN_IF_ERROR(combine(other.data(), data));
      if (bytes > 0) std::memcpy(data, other.data(), static_cast<size_t>(bytes));
    }
  }
  if (me + doubled < n) HORA_RETURN_IF_ERROR(Send(data, bytes, me + doubled));
  return Status::OK();
}

Status TcpCommunicator::AllreduceBitAnd(uint64_t* words, int count) {
  return DoublingAllreduce(words, static_cast<int64_t>(count) * sizeof(uint64_t),
                           [count](void* acc, const void* other) {
                             auto* mine = static_cast<uint64_t*>(acc);
                             const auto* theirs = static_cast<const uint64_t*>(other);
                             for (int i = 0; i < count; ++i) mine[i] &= theirs[i];
                             return Status::OK();
                           });
}

Status TcpCommunicator::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                  ReduceOp op) {
  const int64_t element = DataTypeSize(dtype);
  if (send != nullptr && send != recv && count > 0) {
    std::memcpy(recv, send, static_cast<size_t>(count * element));
  }
  if (size() == 1 || count == 0) return Status::OK();
  if (count * element < kRingMinBytes || count < size()) {
    return DoublingAllreduce(recv, count * element, [&](void* acc, const void* other) {
      return ReduceInto(acc, other, count, dtype, op, "TCP transport");
    });
  }
  return RingAllreduce(recv, count, dtype, op);
}

Status TcpCommunicator::RingAllreduce(void* data, int64_t count, DataType dtype, ReduceOp op) {
  const int n = size(), me = rank();
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  const int64_t element = DataTypeSize(dtype);
  char* bytes = static_cast<char*>(data);
  auto start = [&](int chunk) { return ChunkStart(count, n, (chunk % n + n) % n); };
  auto chunk_count = [&](int chunk) {
    const int c = (chunk % n + n) % n;
    return ChunkStart(count, n, c + 1) - ChunkStart(count, n, c);
  };
  std::vector<char> incoming(static_cast<size_t>((count / n + 1) * element));
  // Reduce-scatter: after n - 1 steps rank r holds the sum of chunk r + 1.
  for (int step = 0; step < n - 1; ++step) {
    const int out = me - step, in = me - step - 1;
    HORA_RETURN_IF_ERROR(SendRecv(bytes + start(out) * element, chunk_count(out) * element, right,
                                  incoming.data(), chunk_count(in) * element, left));
    HORA_RETURN_IF_ERROR(ReduceInto(bytes + start(in) * element, incoming.data(), chunk_count(in),
                                    dtype, op, "TCP transport"));
  }
  // Allgather: pass the finished chunks around.
  for (int step = 0; step < n - 1; ++step) {
    const int out = me + 1 - step, in = me - step;
    HORA_RETURN_IF_ERROR(SendRecv(bytes + start(out) * element, chunk_count(out) * element, right,
                                  bytes + start(in) * element, chunk_count(in) * element, left));
  }
  return Status::OK();
}

Status TcpCommunicator::ReduceScatter(const void* send, void* recv,
                                      const std::vector<int64_t>& recv_counts, DataType dtype,
                                      ReduceOp op) {
  const int n = size(), me = rank();
  const int64_t element = DataTypeSize(dtype);
  std::vector<int64_t> offsets(n + 1, 0);
  for (int k = 0; k < n; ++k) offsets[k + 1] = offsets[k] + recv_counts[k];
  if (n == 1) {
    if (recv_counts[0] > 0 && send != recv) {
      std::memcpy(recv, send, static_cast<size_t>(recv_counts[0] * element));
    }
    return Status::OK();
  }
  std::vector<char> work(static_cast<size_t>(offsets[n] * element));
  if (!work.empty()) std::memcpy(work.data(), send, work.size());
  const int64_t largest = *std::max_element(recv_counts.begin(), recv_counts.end());
  std::vector<char> incoming(static_cast<size_t>(largest * element));
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  auto wrap = [n](int k) { return (k % n + n) % n; };
  // After n - 1 steps rank r holds the sum of chunk r.
  for (int step = 0; step < n - 1; ++step) {
    const int out = wrap(me - step - 1), in = wrap(me - step - 2);
    HORA_RETURN_IF_ERROR(SendRecv(work.data() + offsets[out] * element, recv_counts[out] * element,
                                  right, incoming.data(), recv_counts[in] * element, left));
    HORA_RETURN_IF_ERROR(ReduceInto(work.data() + offsets[in] * element, incoming.data(),
                                    recv_counts[in], dtype, op, "TCP transport"));
  }
  if (recv_counts[me] > 0) {
    std::memcpy(recv, work.data() + offsets[me] * element,
                static_cast<size_t>(recv_counts[me] * element));
  }
  return Status::OK();
}

Status TcpCommunicator::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                                   const std::vector<int64_t>& recv_bytes) {
  const int n = size(), me = rank();
  std::vector<int64_t> offsets(n + 1, 0);
  for (int k = 0; k < n; ++k) offsets[k + 1] = offsets[k] + recv_bytes[k];
  char* out = static_cast<char*>(recv);
  if (send_bytes > 0 && send != out + offsets[me]) {
    std::memmove(out + offsets[me], send, static_cast<size_t>(send_bytes));
  }
  const int right = (me + 1) % n, left = (me - 1 + n) % n;
  auto wrap = [n](int k) { return (k % n + n) % n; };
  for (int step = 0; step < n - 1; ++step) {
    const int give = wrap(me - step), take = wrap(me - step - 1);
    HORA_RETURN_IF_ERROR(SendRecv(out + offsets[give], recv_bytes[give], right, out + offsets[take],
                                  recv_bytes[take], left));
  }
  return Status::OK();
}

Status TcpCommunicator::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                  void* recv, const std::vector<int64_t>& recv_bytes) {
  const int n = size(), me = rank();
  const char* from = static_cast<const char*>(send);
  char* to = static_cast<char*>(recv);
  std::vector<int64_t> send_at(n + 1, 0), recv_at(n + 1, 0);
  for (int k = 0; k < n; ++k) {
    send_at[k + 1] = send_at[k] + send_bytes[k];
    recv_at[k + 1] = recv_at[k] + recv_bytes[k];
  }
  std::vector<std::shared_ptr<TcpFabric::Request>> requests;
  for (int k = 0; k < n; ++k) {
    if (k != me) {
      requests.push_back(
          fabric_->PostRecv(context_, kCollectiveTag, to + recv_at[k], recv_bytes[k], members_[k]));
    }
  }
  for (int step = 1; step < n; ++step) {
    const int k = (me + step) % n;
    requests.push_back(
        fabric_->PostSend(context_, kCollectiveTag, from + send_at[k], send_bytes[k], members_[k]));
  }
  if (recv_bytes[me] > 0) {
    std::memcpy(to + recv_at[me], from + send_at[me], static_cast<size_t>(recv_bytes[me]));
  }
  return WaitEach(&requests);
}

void TcpCommunicator::Revoke() {
  const std::string loss = fabric_->FirstLoss();
  fabric_->Revoke("rank " + std::to_string(fabric_->rank()) + " (host " + topology_.hostname +
                  ") revoked it after a failure" + (loss.empty() ? "" : " (" + loss + ")"));
}

Status TcpCommunicator::Shrink(std::unique_ptr<Communicator>* out) {
  if (rendezvous_ == nullptr) return Communicator::Shrink(out);
  out->reset();
  std::shared_ptr<TcpFabric> fabric;
  HORA_RETURN_IF_ERROR(rendezvous_->FormWorld("shrink", topology_.hostname, &fabric));
  *out = World(std::move(fabric), rendezvous_);
  return Status::OK();
}

Status TcpCommunicator::Exclude(const std::vector<int>& leaving,
                                std::unique_ptr<Communicator>* out) {
  if (rendezvous_ == nullptr) return Communicator::Exclude(leaving, out);
  out->reset();
  if (std::find(leaving.begin(), leaving.end(), rank()) != leaving.end()) {
    return rendezvous_->Leave();
  }
  std::shared_ptr<TcpFabric> fabric;
  HORA_RETURN_IF_ERROR(rendezvous_->FormWorld("shrink", topology_.hostname, &fabric));
  *out = World(std::move(fabric), rendezvous_);
  return Status::OK();
}

namespace {

// Processes the launcher starts for a world (see TcpRendezvous::Spawn).
// Their state is the launcher's; each rank asks it.
class TcpSpawning : public Communicator::Spawning {
 public:
  TcpSpawning(TcpRendezvous* rendezvous, int count)
      : rendezvous_(rendezvous), count_(count), generation_(rendezvous->generation()) {}
  // Given up while its processes still start (a world re-formed, ranks
  // left, or a merge took in only some of them): the launcher ends those
  // that no world took in.
  ~TcpSpawning() override {
    if (!final_ && !cancelled_) rendezvous_->CancelSpawn(generation_);
  }
  int count() const override { return count_; }
  // A merge round took in every process: nothing is left to cancel.
  void Settle() { final_ = true; }
  bool Finished() const override {
    if (final_) return true;
    std::string state;
    const Status status = rendezvous_->SpawnState(&state);
    if (!status.ok()) {
      result_ = status;
    } else if (state == "ready") {
      result_ = Status::OK();
    } else if (state.rfind("failed", 0) == 0) {
      result_ = Status::Internal("a process started to join the world failed" +
                                 (state.size() > 6 ? state.substr(6) : std::string()));
    } else {
      return false;
    }
    final_ = true;
    return true;
  }
  Status result() const override { return result_; }
  // The world will not take them in: the launcher ends them.
  void Cancel() override {
    if (cancelled_) return;
    cancelled_ = true;
    rendezvous_->CancelSpawn(generation_);
  }

 private:
  TcpRendezvous* rendezvous_;
  int count_;
  int64_t generation_;  // of the world that asked for the processes
  mutable bool final_ = false;
  mutable Status result_;
  bool cancelled_ = false;
};

}  // namespace

Status TcpCommunicator::StartSpawn(const std::vector<std::string>& argv, int count,
                                   const SpawnInfo& info, std::shared_ptr<Spawning>* out) {
  if (rendezvous_ == nullptr) return Communicator::StartSpawn(argv, count, info, out);
  std::string hosts;
  for (const auto& item : info) {
    if (item.first == "host") hosts = item.second;
  }
  if (rank() == 0) HORA_RETURN_IF_ERROR(rendezvous_->Spawn(count, argv, hosts));
  *out = std::make_shared<TcpSpawning>(rendezvous_, count);
  return Status::OK();
}

Status TcpCommunicator::Merge(Spawning* spawning, std::unique_ptr<Communicator>* out) {
  out->reset();
  if (rendezvous_ == nullptr || dynamic_cast<TcpSpawning*>(spawning) == nullptr) {
    return Communicator::Merge(spawning, out);
  }
  // The processes that are ready come in, the same on every rank. With
  // none (each was lost on the way), the world formed is this one's ranks
  // again: it is dropped, and every rank goes on with this one.
  std::shared_ptr<TcpFabric> fabric;
  HORA_RETURN_IF_ERROR(rendezvous_->FormWorld("merge", topology_.hostname, &fabric));
  if (fabric->size() == size() + spawning->count()) static_cast<TcpSpawning*>(spawning)->Settle();
  if (fabric->size() == size()) {
    // (rank 0, which asked the launcher how they fare, knows why)
    const Status why = spawning->result();
    if (!why.ok()) return why;
    return Status::Internal("the process(es) started to join the world were lost on the way");
  }
  *out = World(std::move(fabric), rendezvous_);
  return Status::OK();
}

Status TcpCommunicator::PostSend(const void* buffer, int64_t bytes, int dest, int tag, int* id) {
  *id = next_id_++;
  requests_[*id] = fabric_->PostSend(context_, tag, buffer, bytes, members_[dest]);
  return Status::OK();
}

Status TcpCommunicator::PostRecv(void* buffer, int64_t bytes, int source, int tag, int* id) {
  *id = next_id_++;
  requests_[*id] = fabric_->PostRecv(context_, tag, buffer, bytes, members_[source]);
  return Status::OK();
}

Status TcpCommunicator::Wait(int id) {
  const auto it = requests_.find(id);
  if (it == requests_.end()) return Status::OK();
  std::shared_ptr<TcpFabric::Request> request = std::move(it->second);
  requests_.erase(it);
  return fabric_->Wait(request);
}

Status TcpCommunicator::WaitAll() {
  std::vector<std::shared_ptr<TcpFabric::Request>> requests;
  for (auto& entry : requests_) requests.push_back(std::move(entry.second));
  requests_.clear();
  return WaitEach(&requests);
}

Status TcpCommunicator::Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) {
  out->reset();
  ++splits_;
  if (std::find(ranks.begin(), ranks.end(), rank()) == ranks.end()) return Status::OK();
  std::vector<int> members;
  for (int r : ranks) {
    if (r < 0 || r >= size()) {
      return Status::InvalidArgument("TCP transport: no rank " + std::to_string(r) + " among " +
                                     std::to_string(size()));
    }
    members.push_back(members_[r]);
  }
  std::unique_ptr<TcpCommunicator> sub(
      new TcpCommunicator(fabric_, ChildContext(context_, splits_, 0), std::move(members)));
  sub->Build(true);
  *out = std::move(sub);
  return Status::OK();
}

}  // namespace hora
