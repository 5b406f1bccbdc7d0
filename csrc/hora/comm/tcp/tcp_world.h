#pragma once
// The TCP side of init, as mpi_world.h is MPI's: the runtime (core/)
// starts a world over hora's own transport through this.
#include <cstdint>
#include <memory>
#include <string>

#include "hora/comm/communicator.h"

namespace hora {

struct TcpWorldOptions {
  std::string rendezvous;  // the launcher's host:port
  uint64_t cookie = 0;     // the job's, there
  int64_t process_id = 0;  // among the processes the launcher started
  std::string hostname;    // the host this process counts as; empty: its name
};

// Connects to the launcher's rendezvous (once per process) and forms the
// first world with the other processes. The world's Shrink forms the next
// one with the survivors, through the same rendezvous.
Status CreateTcpWorld(const TcpWorldOptions& options, std::unique_ptr<Communicator>* out);

// A process that a world over TCP had the launcher start
// (Communicator::StartSpawn): StartTcpJoining connects to the rendezvous
// and learns the place it will have in the world, without joining;
// FinishTcpJoining joins (with the world's Merge).
Status StartTcpJoining(const TcpWorldOptions& options, Topology* place);
Status FinishTcpJoining(const TcpWorldOptions& options, std::unique_ptr<Communicator>* out);

}  // namespace hora
