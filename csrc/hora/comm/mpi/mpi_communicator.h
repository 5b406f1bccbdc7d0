#pragma once
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

// How the job's MPI communicator was chosen at init.
struct MpiInitOptions {
  MPI_Comm comm = MPI_COMM_NULL;  // a caller's communicator (mpi4py), or NULL
  std::vector<int> ranks;         // a subset of MPI_COMM_WORLD, or empty
  // Which host this rank counts as; empty means ranks that share memory
  // (MPI_COMM_TYPE_SHARED) form a host. Set from HORA_HOSTNAME.
  std::string hostname;
};

// An MPI communicator freed with its last owner (unless MPI is finalized).
struct MpiOwnedComm;

class MpiCommunicator : public Communicator {
 public:
  // Initializes MPI if nobody has (requesting MPI_THREAD_MULTIPLE so user
  // code may also call MPI), duplicates the chosen communicator so our
  // traffic never collides with the application's, and learns the topology.
  static Status Create(const MpiInitOptions& options, std::unique_ptr<MpiCommunicator>* out);
  ~MpiCommunicator() override;

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
  void SetBlockingCollectives(bool blocking) override {
    blocking_ = blocking;
    if (local_) local_->SetBlockingCollectives(blocking);
    if (cross_) cross_->SetBlockingCollectives(blocking);
  }
  Communicator* local() override { return local_.get(); }
  Communicator* cross() override { return cross_.get(); }
  Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) override;
  void Revoke() override;
  Status Shrink(std::unique_ptr<Communicator>* out) override;
  Status Exclude(const std::vector<int>& leaving, std::unique_ptr<Communicator>* out) override;
  Status StartSpawn(const std::vector<std::string>& argv, int count, const SpawnInfo& info,
                    std::shared_ptr<Spawning>* out) override;
  Status Merge(Spawning* spawning, std::unique_ptr<Communicator>* out) override;
  // MPI_THREAD_MULTIPLE.
  bool ConcurrentCalls() const override;
  std::string Describe() const override;

  // A process started by a world's StartSpawn: AwaitJoin initializes MPI
  // and, for such a process (`*joining`), tells the world its host and
  // learns the place it will have there, without joining yet; Join then
  // tells the world it is ready and joins it (collective with the world's
  // Merge).
  static Status AwaitJoin(const std::string& hostname, bool* joining, Topology* place);
  static Status Join(const std::string& hostname, std::unique_ptr<MpiCommunicator>* out);
  // Finalizes MPI at process exit if hora was the one to initialize it.
  static void FinalizeIfOwned();
  static std::string LibraryVersion();

 private:
  MpiCommunicator() = default;
  // MPI_Init_thread (asking for MPI_THREAD_MULTIPLE) unless MPI is
  // initialized; fails without thread support or after MPI_Finalize.
  static Status InitializeMpi();
  // Takes over `comm` (already duplicated) and learns its topology and its
  // local and cross parts; collective over `comm`. A job's world (not a
  // process set's) also gets the duplicate that Spawn travels over.
  static Status Adopt(MPI_Comm comm, const std::string& hostname, bool world,
                      std::unique_ptr<MpiCommunicator>* out);
  // Growth: the logical AND of `flag` (0 or 1) over this world's ranks.
  void Agree(int* flag);
  // Wraps `comm` (taking ownership) as a part of a larger communicator.
  static std::unique_ptr<MpiCommunicator> Part(MPI_Comm comm, bool one_host);
  // Completes a nonblocking call, napping (see common/backoff.h) rather than
  // spinning while the peers are late.
  Status Complete(MPI_Request* request);

  MPI_Comm comm_ = MPI_COMM_NULL;
  // StartSpawn's duplicate (a job's world only), shared with the spawn
  // under way, which can outlive this communicator.
  std::shared_ptr<MpiOwnedComm> spawn_comm_;
  Topology topology_;
  std::unique_ptr<MpiCommunicator> local_;
  std::unique_ptr<MpiCommunicator> cross_;
  std::vector<MPI_Request> requests_;
  bool blocking_ = false;
  std::string hostname_override_;  // HORA_HOSTNAME, kept for Split
};

}  // namespace hora
