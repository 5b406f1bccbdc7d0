#pragma once
// The MPI side of init and exit, in types that need no <mpi.h>: the runtime
// (core/) starts the world through these without knowing the transport.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hora/comm/communicator.h"

namespace hora {

struct MpiWorldOptions {
  // A caller's communicator (mpi4py's handle value: a pointer in Open MPI,
  // an int in MPICH), used when has_comm is set.
  bool has_comm = false;
  intptr_t comm_handle = 0;
  std::vector<int> ranks;  // a subset of MPI_COMM_WORLD, or empty
  // Which host this rank counts as; empty means ranks that share memory form
  // a host.
  std::string hostname;
};

// Initializes MPI if nobody has, and makes the job's communicator.
Status CreateMpiWorld(const MpiWorldOptions& options, std::unique_ptr<Communicator>* out);
// A process that an in-place elastic world started to replace a lost rank
// (Communicator::StartSpawn): StartJoining initializes MPI and, for such a
// process (`*joining`), learns the place it will have in the world without
// joining yet; FinishJoining joins it (with the world's Merge).
Status StartJoining(const MpiWorldOptions& options, bool* joining, Topology* place);
Status FinishJoining(const MpiWorldOptions& options, std::unique_ptr<Communicator>* out);
// Finalizes MPI at process exit if hora was the one to initialize it.
void FinalizeMpiIfOwned();
// "Open MPI v5.0.8, ..." as the library reports itself.
std::string MpiLibraryVersion();
// The file libmpi was loaded from (for the PyPI wheel the build-time prefix
// was a temporary build environment that no longer exists).
std::string MpiLibraryPath();

}  // namespace hora
