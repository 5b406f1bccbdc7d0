#pragma once
#include <mpi.h>

#include <memory>

#include "hora/comm/communicator.h"

namespace hora {

// How the job's MPI communicator was chosen at init.
struct MpiInitOptions {
  MPI_Comm comm = MPI_COMM_NULL;  // a caller's communicator (mpi4py), or NULL
  std::vector<int> ranks;         // a subset of MPI_COMM_WORLD, or empty
};

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
  std::string Describe() const override;

  // Finalizes MPI at process exit if hora was the one to initialize it.
  static void FinalizeIfOwned();
  static std::string LibraryVersion();

 private:
  MpiCommunicator() = default;
  MPI_Comm comm_ = MPI_COMM_NULL;
  Topology topology_;
};

}  // namespace hora
