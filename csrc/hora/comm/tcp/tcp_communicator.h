#pragma once
// hora's own transport: the Communicator contract over plain TCP
// connections (tcp_fabric.h), with the collectives built from
// point-to-point messages. It needs no MPI runtime, so a world over it
// depends on no launcher daemon: the loss of a whole host is a lost
// connection like any other, which the survivors see and outlive.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hora/comm/communicator.h"
#include "hora/comm/tcp/tcp_fabric.h"

namespace hora {

class TcpRendezvous;

// The topology a process of the world whose hosts are `hosts` (in rank
// order) has at `rank`: hosts in the order of their first rank, local ranks
// in rank order within a host.
Topology TcpTopology(const std::vector<std::string>& hosts, int rank);

class TcpCommunicator : public Communicator {
 public:
  // The whole world over a connected fabric, with its local and cross
  // parts. With the launcher's `rendezvous` (which outlives it), Shrink
  // forms the next world through it.
  static std::unique_ptr<TcpCommunicator> World(std::shared_ptr<TcpFabric> fabric,
                                                TcpRendezvous* rendezvous = nullptr);
  // For tests: a world of `size` processes played by threads of this one,
  // connected over loopback TCP; `ranks_per_host` to a pretend host (0:
  // one host). Collective set-up runs on a thread per rank.
  static Status CreateLoopbackWorld(int size, int ranks_per_host,
                                    std::vector<std::unique_ptr<TcpCommunicator>>* out);
  ~TcpCommunicator() override;

  const Topology& topology() const override { return topology_; }
  Status AllreduceBitAnd(uint64_t* words, int count) override;
  Status GatherBytes(const std::string& mine, int root, std::vector<std::string>* all) override;
  Status BroadcastBytes(std::string* data, int root) override;
  Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                   ReduceOp op) override;
  Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                    const std::vector<int64_t>& recv_bytes) override;
  Status Broadcast(void* buffer, int64_t bytes, int root) override;
  Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                   const std::vector<int64_t>& recv_bytes) override;
  Status ReduceScatter(const void* send, void* recv, const std::vector<int64_t>& recv_counts,
                       DataType dtype, ReduceOp op) override;
  Status Barrier() override;
  void Revoke() override;
  // The launcher decides who is in the next world: every process it
  // counts as alive asks for it (see tcp_rendezvous.h).
  Status Shrink(std::unique_ptr<Communicator>* out) override;
  // The leaving ranks tell the launcher so; the others form the next
  // world through it, as after a loss.
  Status Exclude(const std::vector<int>& leaving, std::unique_ptr<Communicator>* out) override;
  // Growth: rank 0 asks the launcher to start the processes (the `host`
  // info key places them); Merge forms the world of this one's ranks and
  // those of them that are ready, through the launcher.
  Status StartSpawn(const std::vector<std::string>& argv, int count, const SpawnInfo& info,
                    std::shared_ptr<Spawning>* out) override;
  Status Merge(Spawning* spawning, std::unique_ptr<Communicator>* out) override;
  Status PostSend(const void* buffer, int64_t bytes, int dest, int tag, int* id) override;
  Status PostRecv(void* buffer, int64_t bytes, int source, int tag, int* id) override;
  Status Wait(int id) override;
  Status WaitAll() override;
  void SetBlockingCollectives(bool) override {}
  Communicator* local() override { return local_.get(); }
  Communicator* cross() override { return cross_.get(); }
  Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) override;
  bool ConcurrentCalls() const override { return true; }
  std::string Describe() const override;

 private:
  TcpCommunicator(std::shared_ptr<TcpFabric> fabric, uint64_t context, std::vector<int> members);
  // Learns the topology from the members' hosts and, unless this is itself
  // a part, makes the local and cross parts.
  void Build(bool with_parts);
  // Blocking point-to-point on the collectives' own tag.
  Status Send(const void* data, int64_t bytes, int dest);
  Status Recv(void* data, int64_t bytes, int source);
  Status SendRecv(const void* send, int64_t send_bytes, int dest, void* recv, int64_t recv_bytes,
                  int source);
  // Waits for every request, cancelling the rest after a failure; the
  // failure.
  Status WaitEach(std::vector<std::shared_ptr<TcpFabric::Request>>* requests);
  // Combines `bytes` at `data` across the ranks with `combine(acc, other)`
  // by recursive doubling: one exchange per doubling (two more for the
  // ranks beyond a power of two), so a 2-rank call costs one message's
  // latency. Both sides of an exchange combine the lower rank's bytes with
  // the higher's, in that order: every rank ends with the same bytes,
  // whatever the arithmetic.
  template <typename Combine>
  Status DoublingAllreduce(void* data, int64_t bytes, Combine combine);
  Status RingAllreduce(void* data, int64_t count, DataType dtype, ReduceOp op);

  std::shared_ptr<TcpFabric> fabric_;
  uint64_t context_;
  std::vector<int> members_;  // this communicator's rank -> rank in the world
  Topology topology_;
  std::unique_ptr<TcpCommunicator> local_;
  std::unique_ptr<TcpCommunicator> cross_;
  TcpRendezvous* rendezvous_ = nullptr;  // the world's only
  uint64_t splits_ = 0;                  // Split calls so far (the same count on every rank)
  std::map<int, std::shared_ptr<TcpFabric::Request>> requests_;
  int next_id_ = 0;
};

}  // namespace hora
