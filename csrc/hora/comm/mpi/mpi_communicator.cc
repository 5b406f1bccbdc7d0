#include "hora/comm/mpi/mpi_communicator.h"
#include "hora/comm/mpi/mpi_call.h"

#include <unistd.h>

#include "hora/common/backoff.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <sstream>

namespace hora {
namespace {

bool g_hora_initialized_mpi = false;

MPI_Datatype ToMpi(DataType dtype) {
  switch (dtype) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt16: return MPI_INT16_T;
    case DataType::kUInt16: return MPI_UINT16_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    // Booleans are 0/1 bytes: logical or is max, logical and is min.
    case DataType::kBool: return MPI_UINT8_T;
    case DataType::kFloat16:
    case DataType::kBFloat16: return MPI_DATATYPE_NULL;
  }
  return MPI_DATATYPE_NULL;
}

// MPI's own MPI_MIN and MPI_MAX keep or drop a NaN depending on which
// rank holds it; these take it from either side, as NumPy's minimum and
// maximum (and the engine's kernels) do. Made once, after MPI_Init, and
// valid until MPI_Finalize.
template <typename T, bool kMax>
void NanWins(void* in, void* inout, int* len, MPI_Datatype*) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *len; ++i) {
    const bool take = kMax ? a[i] > b[i] : a[i] < b[i];
    if (take || a[i] != a[i]) b[i] = a[i];
  }
}

MPI_Op FloatOp(ReduceOp op, DataType dtype) {
  static MPI_Op ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static std::once_flag once;
  std::call_once(once, [] {
    MPI_Op_create(&NanWins<float, false>, 1, &ops[0]);
    MPI_Op_create(&NanWins<float, true>, 1, &ops[1]);
    MPI_Op_create(&NanWins<double, false>, 1, &ops[2]);
    MPI_Op_create(&NanWins<double, true>, 1, &ops[3]);
  });
  return ops[(dtype == DataType::kFloat64 ? 2 : 0) + (op == ReduceOp::kMax ? 1 : 0)];
}

MPI_Op ToMpi(ReduceOp op, DataType dtype) {
  if ((dtype == DataType::kFloat32 || dtype == DataType::kFloat64) &&
      (op == ReduceOp::kMin || op == ReduceOp::kMax)) {
    return FloatOp(op, dtype);
  }
  if (dtype == DataType::kBool) {
    return (op == ReduceOp::kSum || op == ReduceOp::kMax) ? MPI_MAX : MPI_MIN;
  }
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    case ReduceOp::kAdasum: return MPI_OP_NULL;
  }
  return MPI_OP_NULL;
}

Status CheckTypeAndOp(DataType dtype, ReduceOp op, MPI_Datatype* type, MPI_Op* mpi_op) {
  *type = ToMpi(dtype);
  *mpi_op = ToMpi(op, dtype);
  if (*type == MPI_DATATYPE_NULL || *mpi_op == MPI_OP_NULL) {
    return Status::Internal(std::string("MPI reduction not available for ") + DataTypeName(dtype) +
                            " with op " + ReduceOpName(op));
  }
  return Status::OK();
}

Status ToIntCounts(const std::vector<int64_t>& in, std::vector<int>* counts,
                   std::vector<int>* displs) {
  counts->resize(in.size());
  displs->resize(in.size());
  int64_t offset = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] > INT_MAX || offset > INT_MAX) {
      return Status::InvalidArgument(
          "collective exceeds the 2 GiB per-call limit of the MPI transport");
    }
    (*counts)[i] = static_cast<int>(in[i]);
    (*displs)[i] = static_cast<int>(offset);
    offset += in[i];
  }
  return Status::OK();
}

}  // namespace

Status MpiCommunicator::InitializeMpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    return Status::Internal("MPI has already been finalized in this process; hora cannot start");
  }
  if (!initialized) {
    int provided = 0;
    HORA_MPI_CALL(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    g_hora_initialized_mpi = true;
  }
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    return Status::Internal(
        "MPI was initialized without thread support (MPI_THREAD_SERIALIZED or better is "
        "needed because hora runs collectives on a background thread)");
  }
  return Status::OK();
}

Status MpiCommunicator::Create(const MpiInitOptions& options,
                               std::unique_ptr<MpiCommunicator>* out) {
  HORA_RETURN_IF_ERROR(InitializeMpi());

  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm base = options.comm == MPI_COMM_NULL ? MPI_COMM_WORLD : options.comm;
  if (!options.ranks.empty()) {
    int world_rank = 0, world_size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    for (int r : options.ranks) {
      if (r < 0 || r >= world_size) {
        std::ostringstream m;
        m << "init(comm=...): rank " << r << " is outside MPI_COMM_WORLD of size " << world_size;
        return Status::InvalidArgument(m.str());
      }
    }
    if (std::find(options.ranks.begin(), options.ranks.end(), world_rank) == options.ranks.end()) {
      std::ostringstream m;
      m << "init(comm=...): this process (world rank " << world_rank
        << ") is not in the ranks given to init";
      return Status::InvalidArgument(m.str());
    }
    MPI_Group world_group, sub_group;
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    HORA_MPI_CALL(MPI_Group_incl(world_group, static_cast<int>(options.ranks.size()),
                                 options.ranks.data(), &sub_group));
    HORA_MPI_CALL(MPI_Comm_create_group(MPI_COMM_WORLD, sub_group, 0, &comm));
    MPI_Group_free(&sub_group);
    MPI_Group_free(&world_group);
  } else {
    HORA_MPI_CALL(MPI_Comm_dup(base, &comm));
  }
  return Adopt(comm, options.hostname, /*world=*/options.ranks.empty(), out);
}

Status MpiCommunicator::Adopt(MPI_Comm comm, const std::string& hostname, bool world,
                              std::unique_ptr<MpiCommunicator>* out) {
  std::unique_ptr<MpiCommunicator> result(new MpiCommunicator());
  result->comm_ = comm;
  result->hostname_override_ = hostname;
  MPI_Comm_set_errhandler(result->comm_, MPI_ERRORS_RETURN);
  if (world) {
    MPI_Comm spawn = MPI_COMM_NULL;
    HORA_MPI_CALL(MPI_Comm_dup(comm, &spawn));
    MPI_Comm_set_errhandler(spawn, MPI_ERRORS_RETURN);
    result->spawn_comm_ = std::make_shared<MpiOwnedComm>(spawn);
  }

  Topology& t = result->topology_;
  MPI_Comm_rank(result->comm_, &t.rank);
  MPI_Comm_size(result->comm_, &t.size);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  t.hostname = hostname.empty() ? std::string(host) : hostname;
  MPI_Comm local;
  if (hostname.empty()) {
    HORA_MPI_CALL(
        MPI_Comm_split_type(result->comm_, MPI_COMM_TYPE_SHARED, t.rank, MPI_INFO_NULL, &local));
  } else {
    // Ranks that name the same host form a host; its lowest rank is the color.
    std::vector<char> names(static_cast<size_t>(t.size) * 256, 0);
    char mine[256] = {0};
    std::strncpy(mine, hostname.c_str(), sizeof(mine) - 1);
    HORA_MPI_CALL(MPI_Allgather(mine, 256, MPI_CHAR, names.data(), 256, MPI_CHAR, result->comm_));
    int color = t.rank;
    for (int r = 0; r < t.size; ++r) {
      if (std::strncmp(&names[static_cast<size_t>(r) * 256], mine, 256) == 0) {
        color = r;
        break;
      }
    }
    HORA_MPI_CALL(MPI_Comm_split(result->comm_, color, t.rank, &local));
  }
  MPI_Comm_rank(local, &t.local_rank);
  MPI_Comm_size(local, &t.local_size);
  MPI_Comm cross;
  HORA_MPI_CALL(MPI_Comm_split(result->comm_, t.local_rank, t.rank, &cross));
  MPI_Comm_rank(cross, &t.cross_rank);
  MPI_Comm_size(cross, &t.cross_size);
  int min_local = t.local_size, max_local = t.local_size;
  MPI_Allreduce(MPI_IN_PLACE, &min_local, 1, MPI_INT, MPI_MIN, result->comm_);
  MPI_Allreduce(MPI_IN_PLACE, &max_local, 1, MPI_INT, MPI_MAX, result->comm_);
  t.homogeneous = min_local == max_local;
  result->local_ = Part(local, true);
  result->cross_ = Part(cross, false);
  *out = std::move(result);
  return Status::OK();
}

Status MpiCommunicator::Split(const std::vector<int>& ranks, std::unique_ptr<Communicator>* out) {
  out->reset();
  const int me = topology_.rank;
  const auto position = std::find(ranks.begin(), ranks.end(), me);
  const bool member = position != ranks.end();
  MPI_Comm sub = MPI_COMM_NULL;
  HORA_MPI_CALL(MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED,
                               member ? static_cast<int>(position - ranks.begin()) : 0, &sub));
  if (!member) return Status::OK();
  std::unique_ptr<MpiCommunicator> result;
  HORA_RETURN_IF_ERROR(Adopt(sub, hostname_override_, /*world=*/false, &result));
  result->SetBlockingCollectives(blocking_);
  *out = std::move(result);
  return Status::OK();
}

void MpiCommunicator::Revoke() {
#if HORA_HAVE_ULFM
  // Errors are ignored: without `--with-ft ulfm` there is nothing to revoke
  // with, and the job is going down anyway.
  if (comm_ != MPI_COMM_NULL) MPIX_Comm_revoke(comm_);
  if (spawn_comm_) MPIX_Comm_revoke(spawn_comm_->comm);
  if (local_) local_->Revoke();
  if (cross_) cross_->Revoke();
#endif
}

Status MpiCommunicator::Shrink(std::unique_ptr<Communicator>* out) {
  out->reset();
#if HORA_HAVE_ULFM
  MPI_Comm survivors = MPI_COMM_NULL;
  HORA_MPI_CALL(MPIX_Comm_shrink(comm_, &survivors));
  std::unique_ptr<MpiCommunicator> result;
  HORA_RETURN_IF_ERROR(Adopt(survivors, hostname_override_, /*world=*/true, &result));
  // A new world starts with nonblocking collectives on every rank (the
  // survivors' last cycles may have differed).
  *out = std::move(result);
  return Status::OK();
#else
  return Status::Internal("this MPI (" + LibraryVersion() +
                          ") has no ULFM (MPIX_Comm_shrink): the survivors of a lost rank cannot "
                          "form a world in place; Open MPI 5 under `mpirun --with-ft ulfm` can");
#endif
}

Status MpiCommunicator::Exclude(const std::vector<int>& leaving,
                                std::unique_ptr<Communicator>* out) {
  out->reset();
  const bool leaves = std::find(leaving.begin(), leaving.end(), rank()) != leaving.end();
  MPI_Comm rest = MPI_COMM_NULL;
  Status split =
      MpiStatus(MPI_Comm_split(comm_, leaves ? MPI_UNDEFINED : 0, rank(), &rest), "MPI_Comm_split");
#if HORA_HAVE_ULFM
  // A rank lost during the split fails it on some ranks only: agree (the
  // agreement outlives lost ranks), so that either everybody goes on or
  // everybody falls back to a relaunch. The agreement reports a rank lost
  // before it contributed (MPI_ERR_PROC_FAILED) alike on every rank: the
  // new world would hold it, so that is a failure too.
  int ok = split.ok() ? 1 : 0;
  const int agreed = MPIX_Comm_agree(comm_, &ok);
  if (agreed != MPI_SUCCESS) ok = 0;
  if (!ok) {
    if (rest != MPI_COMM_NULL) MPI_Comm_free(&rest);
    if (!split.ok()) return split;
    return agreed != MPI_SUCCESS
               ? MpiStatus(agreed, "MPIX_Comm_agree (a rank was lost while the world split)")
               : Status::Internal("MPI_Comm_split failed on another rank");
  }
#endif
  HORA_RETURN_IF_ERROR(split);
  if (leaves) return Status::OK();
  std::unique_ptr<MpiCommunicator> result;
  HORA_RETURN_IF_ERROR(Adopt(rest, hostname_override_, /*world=*/true, &result));
  *out = std::move(result);
  return Status::OK();
}

bool MpiCommunicator::ConcurrentCalls() const {
  int provided = 0;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::Part(MPI_Comm comm, bool one_host) {
  std::unique_ptr<MpiCommunicator> part(new MpiCommunicator());
  part->comm_ = comm;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  Topology& t = part->topology_;
  MPI_Comm_rank(comm, &t.rank);
  MPI_Comm_size(comm, &t.size);
  t.local_rank = one_host ? t.rank : 0;
  t.local_size = one_host ? t.size : 1;
  t.cross_rank = one_host ? 0 : t.rank;
  t.cross_size = one_host ? 1 : t.size;
  return part;
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCommunicator::FinalizeIfOwned() {
  int finalized = 0, initialized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (g_hora_initialized_mpi && initialized && !finalized) MPI_Finalize();
}

std::string MpiCommunicator::LibraryVersion() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string text(version, length);
  const size_t end = text.find_first_of(",\n");
  return end == std::string::npos ? text : text.substr(0, end);
}

std::string MpiCommunicator::Describe() const { return "MPI (" + LibraryVersion() + ")"; }

Status MpiCommunicator::Complete(MPI_Request* request) {
  Backoff backoff;
  for (;;) {
    int done = 0;
    HORA_MPI_CALL(MPI_Test(request, &done, MPI_STATUS_IGNORE));
    if (done) return Status::OK();
    backoff.Pause();
  }
}

Status MpiCommunicator::AllreduceBitAnd(uint64_t* words, int count) {
  if (blocking_) {
    HORA_MPI_CALL(MPI_Allreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, MPI_BAND, comm_));
    return Status::OK();
  }
  MPI_Request request;
  HORA_MPI_CALL(
      MPI_Iallreduce(MPI_IN_PLACE, words, count, MPI_UINT64_T, MPI_BAND, comm_, &request));
  return Complete(&request);
}

Status MpiCommunicator::GatherBytes(const std::string& mine, int root,
                                    std::vector<std::string>* all) {
  const int size = topology_.size;
  int my_length = static_cast<int>(mine.size());
  std::vector<int> lengths(topology_.rank == root ? size : 0);
  HORA_MPI_CALL(MPI_Gather(&my_length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm_));
  std::vector<int> displs(lengths.size());
  std::string joined;
  if (topology_.rank == root) {
    int64_t total = 0;
    for (int r = 0; r < size; ++r) {
      displs[r] = static_cast<int>(total);
      total += lengths[r];
    }
    joined.resize(total);
  }
  HORA_MPI_CALL(MPI_Gatherv(mine.data(), my_length, MPI_CHAR, &joined[0], lengths.data(),
                            displs.data(), MPI_CHAR, root, comm_));
  if (topology_.rank == root) {
    all->resize(size);
    for (int r = 0; r < size; ++r) (*all)[r] = joined.substr(displs[r], lengths[r]);
  }
  return Status::OK();
}

Status MpiCommunicator::BroadcastBytes(std::string* data, int root) {
  int64_t length = static_cast<int64_t>(data->size());
  HORA_MPI_CALL(MPI_Bcast(&length, 1, MPI_INT64_T, root, comm_));
  data->resize(length);
  return Broadcast(&(*data)[0], length, root);
}

Status MpiCommunicator::Allreduce(const void* send, void* recv, int64_t count, DataType dtype,
                                  ReduceOp op) {
  MPI_Datatype type;
  MPI_Op mpi_op;
  HORA_RETURN_IF_ERROR(CheckTypeAndOp(dtype, op, &type, &mpi_op));
  const int64_t element = DataTypeSize(dtype);
  // MPI counts are int: reduce very large buffers in pieces.
  for (int64_t offset = 0; offset < count; offset += INT_MAX) {
    const int piece = static_cast<int>(std::min<int64_t>(INT_MAX, count - offset));
    char* r = static_cast<char*>(recv) + offset * element;
    const void* s =
        send == nullptr ? MPI_IN_PLACE : static_cast<const char*>(send) + offset * element;
    if (blocking_) {
      HORA_MPI_CALL(MPI_Allreduce(s, r, piece, type, mpi_op, comm_));
    } else {
      MPI_Request request;
      HORA_MPI_CALL(MPI_Iallreduce(s, r, piece, type, mpi_op, comm_, &request));
      HORA_RETURN_IF_ERROR(Complete(&request));
    }
  }
  return Status::OK();
}

Status MpiCommunicator::Allgatherv(const void* send, int64_t send_bytes, void* recv,
                                   const std::vector<int64_t>& recv_bytes) {
  std::vector<int> counts, displs;
  HORA_RETURN_IF_ERROR(ToIntCounts(recv_bytes, &counts, &displs));
  if (send_bytes > INT_MAX) return Status::InvalidArgument("allgather input exceeds 2 GiB");
  HORA_MPI_CALL(MPI_Allgatherv(send, static_cast<int>(send_bytes), MPI_BYTE, recv, counts.data(),
                               displs.data(), MPI_BYTE, comm_));
  return Status::OK();
}

Status MpiCommunicator::Broadcast(void* buffer, int64_t bytes, int root) {
  int64_t offset = 0;
  do {  // runs once for an empty buffer so every rank makes the same calls
    const int piece = static_cast<int>(std::min<int64_t>(INT_MAX, bytes - offset));
    HORA_MPI_CALL(MPI_Bcast(static_cast<char*>(buffer) + offset, piece, MPI_BYTE, root, comm_));
    offset += piece;
  } while (offset < bytes);
  return Status::OK();
}

Status MpiCommunicator::Alltoallv(const void* send, const std::vector<int64_t>& send_bytes,
                                  void* recv, const std::vector<int64_t>& recv_bytes) {
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  HORA_RETURN_IF_ERROR(ToIntCounts(send_bytes, &send_counts, &send_displs));
  HORA_RETURN_IF_ERROR(ToIntCounts(recv_bytes, &recv_counts, &recv_displs));
  HORA_MPI_CALL(MPI_Alltoallv(send, send_counts.data(), send_displs.data(), MPI_BYTE, recv,
                              recv_counts.data(), recv_displs.data(), MPI_BYTE, comm_));
  return Status::OK();
}

Status MpiCommunicator::ReduceScatter(const void* send, void* recv,
                                      const std::vector<int64_t>& recv_counts, DataType dtype,
                                      ReduceOp op) {
  MPI_Datatype type;
  MPI_Op mpi_op;
  HORA_RETURN_IF_ERROR(CheckTypeAndOp(dtype, op, &type, &mpi_op));
  std::vector<int> counts, displs;
  HORA_RETURN_IF_ERROR(ToIntCounts(recv_counts, &counts, &displs));
  HORA_MPI_CALL(MPI_Reduce_scatter(send, recv, counts.data(), type, mpi_op, comm_));
  return Status::OK();
}

Status MpiCommunicator::PostSend(const void* buffer, int64_t bytes, int dest, int tag, int* id) {
  if (bytes > INT_MAX) return Status::Internal("point-to-point message over 2 GiB");
  requests_.push_back(MPI_REQUEST_NULL);
  *id = static_cast<int>(requests_.size()) - 1;
  HORA_MPI_CALL(
      MPI_Isend(buffer, static_cast<int>(bytes), MPI_BYTE, dest, tag, comm_, &requests_.back()));
  return Status::OK();
}

Status MpiCommunicator::PostRecv(void* buffer, int64_t bytes, int source, int tag, int* id) {
  if (bytes > INT_MAX) return Status::Internal("point-to-point message over 2 GiB");
  requests_.push_back(MPI_REQUEST_NULL);
  *id = static_cast<int>(requests_.size()) - 1;
  HORA_MPI_CALL(
      MPI_Irecv(buffer, static_cast<int>(bytes), MPI_BYTE, source, tag, comm_, &requests_.back()));
  return Status::OK();
}

Status MpiCommunicator::Wait(int id) { return Complete(&requests_[id]); }

Status MpiCommunicator::WaitAll() {
  Backoff backoff;
  for (;;) {
    int done = 0;
    const int code = MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                                 MPI_STATUSES_IGNORE);
    if (code != MPI_SUCCESS) requests_.clear();
    HORA_MPI_CALL(code);
    if (done) break;
    backoff.Pause();
  }
  requests_.clear();
  return Status::OK();
}

Status MpiCommunicator::Barrier() {
  HORA_MPI_CALL(MPI_Barrier(comm_));
  return Status::OK();
}

}  // namespace hora
