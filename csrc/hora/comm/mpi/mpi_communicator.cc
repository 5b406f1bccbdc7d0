#include "hora/comm/mpi/mpi_communicator.h"

#include <unistd.h>

#include "hora/common/backoff.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

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

namespace hora {

struct MpiOwnedComm {
  explicit MpiOwnedComm(MPI_Comm c) : comm(c) {}
  ~MpiOwnedComm() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  MPI_Comm comm;
};

namespace {

bool g_hora_initialized_mpi = false;

Status MpiStatus(int code, const char* call) {
  if (code == MPI_SUCCESS) return Status::OK();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return Status::Internal(std::string(call) + " failed: " + std::string(text, length));
}

#define HORA_MPI_CALL(call) HORA_RETURN_IF_ERROR(MpiStatus((call), #call))

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

// What a world and the processes it starts tell each other over the
// intercommunicator before those join: each new process its host name, the
// world's first rank each new one its place (the topology it will have),
// each new one that it is ready to take the state (it has reached
// hvd.elastic.run), so that the world then pauses only to take it in.
// A world that no longer needs them (it finished, or the spawn was given
// up) says so instead: a place of rank -1, or 0 for "go".
constexpr int kTagHost = 1, kTagPlace = 2, kTagReady = 3, kTagGo = 4;
constexpr int kHostNameBytes = 256;
constexpr int kPlaceFields = 7;

struct HostName {
  explicit HostName(const std::string& override_name) {
    if (override_name.empty())
      gethostname(text, sizeof(text) - 1);
    else
      std::strncpy(text, override_name.c_str(), sizeof(text) - 1);
  }
  char text[kHostNameBytes] = {0};
};

Topology PlaceFromFields(const int* f, const char* host) {
  Topology t;
  t.rank = f[0];
  t.size = f[1];
  t.local_rank = f[2];
  t.local_size = f[3];
  t.cross_rank = f[4];
  t.cross_size = f[5];
  t.homogeneous = f[6] != 0;
  t.hostname = host;
  return t;
}

// The places of the ranks of a world whose ranks are on `hosts` (by
// rank), as Adopt will find them: a host's ranks in rank order, and each
// local rank's ranks across the hosts in rank order.
std::vector<std::array<int, kPlaceFields>> Places(const std::vector<std::string>& hosts) {
  const int size = static_cast<int>(hosts.size());
  std::vector<int> local_rank(hosts.size()), local_size(hosts.size());
  for (int r = 0; r < size; ++r) {
    for (int q = 0; q < size; ++q) {
      if (hosts[q] != hosts[r]) continue;
      if (q < r) ++local_rank[r];
      ++local_size[r];
    }
  }
  const auto [low, high] = std::minmax_element(local_size.begin(), local_size.end());
  std::vector<std::array<int, kPlaceFields>> places(hosts.size());
  for (int r = 0; r < size; ++r) {
    int cross_rank = 0, cross_size = 0;
    for (int q = 0; q < size; ++q) {
      if (local_rank[q] != local_rank[r]) continue;
      if (q < r) ++cross_rank;
      ++cross_size;
    }
    places[r] = {r, size, local_rank[r], local_size[r], cross_rank, cross_size, *low == *high};
  }
  return places;
}

Status NotNeeded() {
  return Status::Shutdown("the new processes are not needed any more (the world finished)");
}

// Tells the new processes, each waiting for `tag`, that they are not needed.
void SendNotNeeded(MPI_Comm joiners, int tag) {
  int count = 0;
  MPI_Comm_remote_size(joiners, &count);
  int place[kPlaceFields] = {-1, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < count; ++j) {
    if (tag == kTagPlace)
      MPI_Send(place, kPlaceFields, MPI_INT, j, tag, joiners);
    else
      MPI_Send(place + 1, 1, MPI_INT, j, tag, joiners);  // 0: no
  }
}

// The world's side of that exchange, on the spawn's thread: every rank
// tells the others its host; the first one tells each new process its
// place and waits until all are ready (or until `cancel`).
Status Welcome(MPI_Comm world, MPI_Comm joiners, const std::string& hostname,
               const std::atomic<bool>& cancel) {
  int rank = 0, size = 0, count = 0;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  MPI_Comm_remote_size(joiners, &count);
  HostName mine(hostname);
  std::vector<char> names(static_cast<size_t>(size + count) * kHostNameBytes, 0);
  HORA_RETURN_IF_ERROR(MpiStatus(MPI_Allgather(mine.text, kHostNameBytes, MPI_CHAR, names.data(),
                                               kHostNameBytes, MPI_CHAR, world),
                                 "MPI_Allgather"));
  if (rank != 0) return Status::OK();
  for (int j = 0; j < count; ++j) {
    HORA_RETURN_IF_ERROR(
        MpiStatus(MPI_Recv(&names[static_cast<size_t>(size + j) * kHostNameBytes], kHostNameBytes,
                           MPI_CHAR, j, kTagHost, joiners, MPI_STATUS_IGNORE),
                  "MPI_Recv"));
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < size + count; ++r) {
    const char* name = &names[static_cast<size_t>(r) * kHostNameBytes];
    hosts.emplace_back(name, strnlen(name, kHostNameBytes));
  }
  if (cancel) {
    SendNotNeeded(joiners, kTagPlace);
    return NotNeeded();
  }
  const auto places = Places(hosts);
  for (int j = 0; j < count; ++j) {
    HORA_RETURN_IF_ERROR(
        MpiStatus(MPI_Send(places[size + j].data(), kPlaceFields, MPI_INT, j, kTagPlace, joiners),
                  "MPI_Send"));
  }
  for (int j = 0; j < count; ++j) {
    int ready = 0;
    MPI_Request request = MPI_REQUEST_NULL;
    HORA_RETURN_IF_ERROR(
        MpiStatus(MPI_Irecv(&ready, 1, MPI_INT, j, kTagReady, joiners, &request), "MPI_Irecv"));
    Backoff backoff;
    for (;;) {
      int done = 0;
      HORA_RETURN_IF_ERROR(MpiStatus(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test"));
      if (done) break;
      if (cancel) {
        MPI_Cancel(&request);
        MPI_Request_free(&request);
        SendNotNeeded(joiners, kTagGo);
        return NotNeeded();
      }
      backoff.Pause();
    }
  }
  return Status::OK();
}

// A spawn under way on a thread of its own. The thread shares `state`
// (and the duplicate it spawns over), so a spawn that a lost rank left
// hanging can be abandoned: the Spawning is dropped, the thread is not.
class MpiSpawning : public Communicator::Spawning {
 public:
  struct State {
    std::shared_ptr<MpiOwnedComm> over;
    std::atomic<bool> finished{false};
    std::mutex mutex;
    Status status;
    MPI_Comm joiners = MPI_COMM_NULL;  // the intercommunicator, once spawned
    bool abandoned = false;            // dropped before its processes joined
    std::string hostname;              // HORA_HOSTNAME, or empty
    std::atomic<bool> cancel{false};   // the world finished: tell them
  };
  MpiSpawning(std::shared_ptr<State> state, int count) : state_(std::move(state)), count_(count) {}
  // Dropped without Merge: the new processes, waiting to join, are told
  // (their hora.init fails) rather than left waiting for ever.
  ~MpiSpawning() override {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->abandoned = true;
      Dismiss(state_.get());
    }
    if (thread_.joinable()) {
      if (state_->finished)
        thread_.join();
      else
        thread_.detach();
    }
  }
  void Run(std::vector<std::string> argv) {
    thread_ = std::thread([state = state_, argv = std::move(argv), count = count_] {
      std::vector<char*> args;
      for (size_t i = 1; i < argv.size(); ++i) args.push_back(const_cast<char*>(argv[i].c_str()));
      args.push_back(nullptr);
      std::vector<int> codes(static_cast<size_t>(count), MPI_SUCCESS);
      MPI_Comm joiners = MPI_COMM_NULL;
      Status status = MpiStatus(MPI_Comm_spawn(argv[0].c_str(), args.data(), count, MPI_INFO_NULL,
                                               0, state->over->comm, &joiners, codes.data()),
                                "MPI_Comm_spawn");
      for (int code : codes) {
        if (status.ok() && code != MPI_SUCCESS) status = MpiStatus(code, "a spawned process");
      }
      if (joiners != MPI_COMM_NULL) MPI_Comm_set_errhandler(joiners, MPI_ERRORS_RETURN);
      if (status.ok()) status = Welcome(state->over->comm, joiners, state->hostname, state->cancel);
      std::lock_guard<std::mutex> lock(state->mutex);
      state->status = status;
      state->joiners = joiners;
      if (state->abandoned) Dismiss(state.get());
      state->finished = true;
    });
  }
  int count() const override { return count_; }
  bool Finished() const override { return state_->finished; }
  void Cancel() override {
    state_->cancel = true;
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(state_->mutex);
    int rank = 0;
    MPI_Comm_rank(state_->over->comm, &rank);
    // Ready and waiting for "go": tell them no.
    if (state_->status.ok() && state_->joiners != MPI_COMM_NULL && rank == 0) {
      SendNotNeeded(state_->joiners, kTagGo);
    }
    if (state_->joiners != MPI_COMM_NULL) MPI_Comm_free(&state_->joiners);
  }
  Status result() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->finished) return Status::Internal("the spawn has not finished");
    return state_->status;
  }
  // Waits for the thread; the intercommunicator (now the caller's), or an
  // error.
  Status Joiners(MPI_Comm* out) {
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(state_->mutex);
    *out = state_->joiners;
    state_->joiners = MPI_COMM_NULL;
    return state_->status;
  }

 private:
  static void Dismiss(State* state) {
    if (state->joiners == MPI_COMM_NULL) return;
#if HORA_HAVE_ULFM
    MPIX_Comm_revoke(state->joiners);
#endif
    MPI_Comm_free(&state->joiners);
  }

  std::shared_ptr<State> state_;
  int count_;
  std::thread thread_;
};

}  // namespace

Status MpiCommunicator::AwaitJoin(const std::string& hostname, bool* joining, Topology* place) {
  *joining = false;
  HORA_RETURN_IF_ERROR(InitializeMpi());
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent == MPI_COMM_NULL) return Status::OK();
  MPI_Comm_set_errhandler(parent, MPI_ERRORS_RETURN);
  HostName name(hostname);
  HORA_MPI_CALL(MPI_Send(name.text, kHostNameBytes, MPI_CHAR, 0, kTagHost, parent));
  int fields[kPlaceFields] = {0};
  HORA_MPI_CALL(MPI_Recv(fields, kPlaceFields, MPI_INT, 0, kTagPlace, parent, MPI_STATUS_IGNORE));
  if (fields[0] < 0) return NotNeeded();
  *place = PlaceFromFields(fields, name.text);
  *joining = true;
  return Status::OK();
}

Status MpiCommunicator::Join(const std::string& hostname, std::unique_ptr<MpiCommunicator>* out) {
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent == MPI_COMM_NULL) return Status::Internal("this process was not started to join");
  const int ready = 1;
  HORA_MPI_CALL(MPI_Send(&ready, 1, MPI_INT, 0, kTagReady, parent));
  int go = 0;
  HORA_MPI_CALL(MPI_Recv(&go, 1, MPI_INT, 0, kTagGo, parent, MPI_STATUS_IGNORE));
  if (!go) return NotNeeded();
  MPI_Comm merged = MPI_COMM_NULL;
  HORA_MPI_CALL(MPI_Intercomm_merge(parent, 1, &merged));
  return Adopt(merged, hostname, /*world=*/true, out);
}

Status MpiCommunicator::StartSpawn(const std::vector<std::string>& argv, int count,
                                   std::shared_ptr<Spawning>* out) {
  out->reset();
  if (!spawn_comm_) return Status::Internal("only a job's world can start processes");
  if (argv.empty() || count <= 0) {
    return Status::InvalidArgument("spawn: a command and a positive count are needed");
  }
  auto state = std::make_shared<MpiSpawning::State>();
  state->over = spawn_comm_;
  state->hostname = hostname_override_;
  auto spawning = std::make_shared<MpiSpawning>(state, count);
  spawning->Run(argv);
  *out = std::move(spawning);
  return Status::OK();
}

Status MpiCommunicator::Merge(Spawning* spawning, std::unique_ptr<Communicator>* out) {
  out->reset();
  auto* mpi = dynamic_cast<MpiSpawning*>(spawning);
  if (mpi == nullptr) return Status::Internal("merge: not an MPI spawn");
  MPI_Comm joiners = MPI_COMM_NULL;
  Status status = mpi->Joiners(&joiners);
  MPI_Comm merged = MPI_COMM_NULL;
  std::unique_ptr<MpiCommunicator> result;
  if (status.ok() && topology_.rank == 0) {
    const int go = 1;
    for (int j = 0; j < mpi->count() && status.ok(); ++j) {
      status = MpiStatus(MPI_Send(&go, 1, MPI_INT, j, kTagGo, joiners), "MPI_Send");
    }
  }
  if (status.ok()) {
    status = MpiStatus(MPI_Intercomm_merge(joiners, 0, &merged), "MPI_Intercomm_merge");
  }
  if (joiners != MPI_COMM_NULL) {
    if (!status.ok()) {
#if HORA_HAVE_ULFM
      MPIX_Comm_revoke(joiners);
#endif
    }
    MPI_Comm_free(&joiners);
  }
  if (status.ok()) status = Adopt(merged, hostname_override_, /*world=*/true, &result);
  // A new process lost on the way fails these on some ranks only: agree.
  // (Over the spawn's duplicate: the engine thread may still be using
  // comm_.)
  int ok = status.ok() ? 1 : 0;
#if HORA_HAVE_ULFM
  MPIX_Comm_agree(spawn_comm_->comm, &ok);
#else
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, spawn_comm_->comm);
#endif
  if (!ok) {
    if (status.ok()) status = Status::Internal("a process that was to join was lost on the way");
    return status.WithContext("merge");
  }
  // (nonblocking collectives, as the new processes' world starts)
  *out = std::move(result);
  return Status::OK();
}

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
