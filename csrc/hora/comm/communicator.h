#pragma once
// The transport contract for host memory. The engine and the algorithms
// talk only to this interface. Its implementations are MPI (mpi/), hora's
// own TCP transport (tcp/) and, for tests, ranks as threads of one process
// (local/). The other folders of
// comm/ hold what the engine uses beside it: NCCL communicators for GPU
// memory (nccl/), a shared-memory segment for one host's ranks (shm/) and
// the wake-up channel (wakeup/).
//
// All calls are collective over the communicator's ranks and are made from
// an engine thread only (Spawn excepted, below) (the job's, or a process set's over its own
// split). Reductions here cover the natively supported element types;
// float16/bfloat16 are widened to float32 by the caller.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hora/common/dtype.h"
#include "hora/common/status.h"
#include "hora/common/collective.h"

namespace hora {

struct Topology {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int cross_rank = 0;
  int cross_size = 1;
  bool homogeneous = true;
  std::string hostname;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const Topology& topology() const = 0;
  int rank() const { return topology().rank; }
  int size() const { return topology().size; }

  // Control plane: small messages for negotiation.
  virtual Status AllreduceBitAnd(uint64_t* words, int count) = 0;
  // Root receives every rank's bytes in `all` (index = rank).
  virtual Status GatherBytes(const std::string& mine, int root, std::vector<std::string>* all) = 0;
  virtual Status BroadcastBytes(std::string* data, int root) = 0;

  // Data plane on host memory. `send == nullptr` means in place on `recv`.
  virtual Status Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                           ReduceOp op) = 0;
  virtual Status Allgatherv(const void* send, int64_t send_bytes, void* recv,
                            const std::vector<int64_t>& recv_bytes) = 0;
  virtual Status Broadcast(void* buffer, int64_t bytes, int root) = 0;
  virtual Status Alltoallv(const void* send, const std::vector<int64_t>& send_bytes, void* recv,
                           const std::vector<int64_t>& recv_bytes) = 0;
  virtual Status ReduceScatter(const void* send, void* recv,
                               const std::vector<int64_t>& recv_counts, DataType dtype,
                               ReduceOp op) = 0;
  virtual Status Barrier() = 0;

  // In-place recovery (ULFM: Open MPI 5 under `mpirun --with-ft ulfm`).
  // Revoke makes every pending and later call on this communicator and its
  // local and cross parts fail, on every rank, so that no survivor keeps
  // waiting for a lost peer; any thread may call it. Shrink makes a
  // communicator of the ranks still alive, collective over them. Without
  // that support Revoke does nothing and Shrink fails.
  virtual void Revoke() {}
  virtual Status Shrink(std::unique_ptr<Communicator>* out) {
    out->reset();
    return Status::Internal(Describe() + " cannot continue without a lost rank");
  }
  // A planned departure (the hosts of `leaving`, ranks of this
  // communicator, left the job): collective over every rank, the leaving
  // ones included. The others get a communicator of their own, in their
  // order, as Shrink would make; the leaving ones get null. Nobody is
  // lost, so nothing is revoked, and no failure has to be detected first.
  virtual Status Exclude(const std::vector<int>& leaving, std::unique_ptr<Communicator>* out) {
    out->reset();
    (void)leaving;
    return Status::Internal(Describe() + " cannot let ranks leave the world in place");
  }

  // Growth in place (MPI dynamic processes). StartSpawn starts `count`
  // new processes running `argv` (argv[0] the program), collective over
  // this communicator's ranks, and returns at once: unlike every other call
  // the spawn runs on a thread of its own, over a duplicate made with this
  // communicator, while the engine thread goes on using it. The Spawning
  // says when the new processes are connected (as long as their start
  // takes) and outlives this communicator. Merge then makes a communicator
  // of this one's ranks followed by the new processes, collective over all
  // of them (the new ones get theirs from CreateMpiWorld); it fails alike
  // on every rank of this one when a new process was lost on the way.
  class Spawning {
   public:
    virtual ~Spawning() = default;
    virtual int count() const = 0;
    // Whether the spawn has ended; its result once it has.
    virtual bool Finished() const = 0;
    virtual Status result() const = 0;
    // The world will not take them in (it finished): tells the new
    // processes so (their hora.init, or their joining, ends saying they
    // are not needed); waits for the spawn to end first.
    virtual void Cancel() = 0;
  };
  // `info`: the spawn's MPI_Info keys (Open MPI's "host" places the new
  // processes, "PMIX_ADD_HOST" first adds hosts the job did not start with).
  using SpawnInfo = std::vector<std::pair<std::string, std::string>>;
  virtual Status StartSpawn(const std::vector<std::string>& argv, int count, const SpawnInfo& info,
                            std::shared_ptr<Spawning>* out) {
    out->reset();
    (void)argv;
    (void)count;
    (void)info;
    return Status::Internal(Describe() + " cannot start processes that join the world");
  }
  virtual Status Merge(Spawning* spawning, std::unique_ptr<Communicator>* out) {
    out->reset();
    (void)spawning;
    return Status::Internal(Describe() + " cannot take processes into the world");
  }

  // Nonblocking point-to-point for the algorithms in algo/ (ring). Post*
  // return an id; Wait(id) completes that one, WaitAll() every posted one.
  // Messages of one (source, tag) pair arrive in the order they were sent.
  virtual Status PostSend(const void* buffer, int64_t bytes, int dest, int tag, int* id) = 0;
  virtual Status PostRecv(void* buffer, int64_t bytes, int source, int tag, int* id) = 0;
  virtual Status Wait(int id) = 0;
  virtual Status WaitAll() = 0;

  // Blocking collectives are the fastest way to wait when the peers are
  // about to arrive; nonblocking ones completed with naps cost no CPU while
  // they are late. MPI does not match one kind against the other, so every
  // rank must make the same choice for each collective: the engine sets it
  // from state all ranks share.
  virtual void SetBlockingCollectives(bool blocking) = 0;

  // The ranks on this host, and the ranks with this rank's local rank on
  // every host (for hierarchical algorithms). Owned by this communicator;
  // nullptr on communicators that are themselves such a part.
  virtual Communicator* local() = 0;
  virtual Communicator* cross() = 0;

  // A communicator of some of this one's ranks (a process set), made
  // collectively: every rank calls it with the same sorted `ranks`; members
  // get a communicator whose rank r is ranks[r], the others nullptr. It has
  // its own local() and cross() parts where the transport can tell hosts.
  virtual Status Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) = 0;
  // Whether threads may call collectives on different communicators of
  // this transport at the same time (each process set's engine has a
  // thread of its own).
  virtual bool ConcurrentCalls() const = 0;

  // What the transport is, for build_info and logs ("MPI (Open MPI v5.0.11)").
  virtual std::string Describe() const = 0;
};

}  // namespace hora
