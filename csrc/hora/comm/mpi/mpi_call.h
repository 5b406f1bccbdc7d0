#pragma once
// What the MPI transport's sources share: MPI errors as Status, a
// communicator freed with its last owner, and whether the library has
// ULFM (Open MPI 5's fault-tolerance extension).
#include <mpi.h>

#include <string>

// Open MPI's extensions: ULFM's MPIX_Comm_revoke and MPIX_Comm_shrink
// where the library was built with fault tolerance (Open MPI 5).
#if defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif
#if defined(OMPI_HAVE_MPI_EXT_FTMPI) && OMPI_HAVE_MPI_EXT_FTMPI
#define HORA_HAVE_ULFM 1
#else
#define HORA_HAVE_ULFM 0
#endif

#include "hora/common/status.h"

namespace hora {

// A communicator freed with its last owner (unless MPI is finalized).
struct MpiOwnedComm {
  explicit MpiOwnedComm(MPI_Comm c) : comm(c) {}
  ~MpiOwnedComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  MPI_Comm comm;
};

inline Status MpiStatus(int code, const char* call) {
  if (code == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return Status::Internal(std::string(call) + " failed: " + std::string(text, length));
}

#define HORA_MPI_CALL(call) HORA_RETURN_IF_ERROR(MpiStatus((call), #call))

}  // namespace hora
