#include "hora/comm/mpi/mpi_world.h"

#include <dlfcn.h>
#include <mpi.h>
#include <stdlib.h>

#include <type_traits>

#include "hora/comm/mpi/mpi_communicator.h"

namespace hora {
namespace {

// MPI_Comm is a pointer in Open MPI and an int in MPICH; mpi4py's handle is
// the same value either way. A template so only the matching branch compiles.
template <typename Comm>
Comm CommFromHandle(intptr_t handle) {
  if constexpr (std::is_pointer<Comm>::value) {
    return reinterpret_cast<Comm>(handle);
  } else {
    return static_cast<Comm>(handle);
  }
}

}  // namespace

Status CreateMpiWorld(const MpiWorldOptions& options, std::unique_ptr<Communicator>* out) {
  MpiInitOptions mpi;
  if (options.has_comm) mpi.comm = CommFromHandle<MPI_Comm>(options.comm_handle);
  mpi.ranks = options.ranks;
  mpi.hostname = options.hostname;
  std::unique_ptr<MpiCommunicator> comm;
  HORA_RETURN_IF_ERROR(MpiCommunicator::Create(mpi, &comm));
  *out = std::move(comm);
  return Status::OK();
}

Status StartJoining(const MpiWorldOptions& options, bool* joining, Topology* place) {
  *joining = false;
  if (options.has_comm || !options.ranks.empty()) return Status::OK();
  return MpiCommunicator::AwaitJoin(options.hostname, joining, place);
}

Status FinishJoining(const MpiWorldOptions& options, std::unique_ptr<Communicator>* out) {
  std::unique_ptr<MpiCommunicator> comm;
  HORA_RETURN_IF_ERROR(MpiCommunicator::Join(options.hostname, &comm));
  *out = std::move(comm);
  return Status::OK();
}

void FinalizeMpiIfOwned() { MpiCommunicator::FinalizeIfOwned(); }

std::string MpiLibraryVersion() { return MpiCommunicator::LibraryVersion(); }

std::string MpiLibraryPath() {
  Dl_info loaded{};
  std::string path;
  if (dladdr(reinterpret_cast<void*>(&MPI_Init), &loaded) && loaded.dli_fname) {
    char* resolved = realpath(loaded.dli_fname, nullptr);
    path = resolved ? resolved : loaded.dli_fname;
    free(resolved);
  }
  return path;
}

}  // namespace hora
