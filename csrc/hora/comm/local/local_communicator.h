#pragma once
// An in-process transport: the ranks are threads of one process and
// messages are copies through shared queues. It lets the engine's pieces
// (negotiation, algorithms, the collective plan) be tested with any number
// of ranks in milliseconds, without MPI or a launcher; it is not a
// production transport.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

// The shared state of one group of thread-ranks: a FIFO of messages for
// every (source, destination, tag).
class LocalWorld {
 public:
  explicit LocalWorld(int size)
      : size_(size), arrived_(new std::condition_variable[static_cast<size_t>(size)]) {}
  int size() const { return size_; }
  void Send(int source, int dest, int tag, const void* data, int64_t bytes);
  // Blocks until a message arrives, or fails after `timeout` (a test whose
  // peer never sends reports that instead of hanging).
  Status Receive(int source, int dest, int tag, std::string* message);

  // The world of a Split: the first member to ask makes it, the others
  // find it by the split's sequence number.
  std::shared_ptr<LocalWorld> SubWorld(uint64_t sequence, int size);

  std::chrono::milliseconds timeout{60000};

 private:
  int size_;
  std::mutex mutex_;
  // One per destination rank: a message wakes only its receiver, so a
  // world of a thousand thread-ranks does not wake every thread per message.
  std::unique_ptr<std::condition_variable[]> arrived_;
  std::map<std::tuple<int, int, int>, std::deque<std::string>> queues_;
  std::map<uint64_t, std::shared_ptr<LocalWorld>> sub_worlds_;
};

class LocalCommunicator : public Communicator {
 public:
  // One communicator per rank of a job of `size` ranks, `ranks_per_host`
  // to a (pretend) host: the hierarchical algorithms see `size /
  // ranks_per_host` hosts, each rank's local() the ranks of its host and
  // cross() the ranks with its local rank on every host.
  static std::vector<std::unique_ptr<LocalCommunicator>> CreateWorld(int size,
                                                                     int ranks_per_host = 0);

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
  Status PostSend(const void* buffer, int64_t bytes, int dest, int tag, int* id) override;
  Status PostRecv(void* buffer, int64_t bytes, int source, int tag, int* id) override;
  Status Wait(int id) override;
  Status WaitAll() override;
  void SetBlockingCollectives(bool) override {}
  // How long a receive waits before failing (default one minute).
  void SetTimeout(std::chrono::milliseconds timeout) { world_->timeout = timeout; }
  Communicator* local() override { return local_.get(); }
  Communicator* cross() override { return cross_.get(); }
  // The subset's ranks count as one host (no local or cross parts).
  Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) override;
  bool ConcurrentCalls() const override { return true; }
  std::string Describe() const override;

 private:
  LocalCommunicator(std::shared_ptr<LocalWorld> world, Topology topology)
      : world_(std::move(world)), topology_(std::move(topology)) {}
  Status ReceiveExactly(int source, int tag, void* buffer, int64_t bytes);

  std::shared_ptr<LocalWorld> world_;
  Topology topology_;
  std::unique_ptr<LocalCommunicator> local_;
  std::unique_ptr<LocalCommunicator> cross_;
  // Posted receives, completed in the order they were posted so that two
  // receives from one (source, tag) match messages in order, as in MPI.
  struct Pending {
    int id;
    void* buffer;
    int64_t bytes;
    int source;
    int tag;
  };
  std::deque<Pending> pending_;
  // Posted sends, with the bytes they sent. The message is copied when it
  // is posted, but MPI may read the buffer any time until the send is
  // complete, so completing one checks that nobody wrote to its buffer in
  // the meantime: what MPI would have sent.
  struct PostedSend {
    const void* buffer;
    std::string bytes;
  };
  std::map<int, PostedSend> sends_;
  Status CompleteSend(std::map<int, PostedSend>::iterator send);
  int next_id_ = 0;
  uint64_t splits_ = 0;  // Split calls so far (the same count on every rank)
  // Marks a split's local part among the sub-worlds (Split's sequence keys them).
  static constexpr uint64_t kLocalPart = uint64_t{1} << 63;
};

}  // namespace hora
