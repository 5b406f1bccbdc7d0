// Growth in place: the MPI side of Communicator::StartSpawn and Merge (the
// world's) and of AwaitJoin and Join (the new processes').
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "hora/comm/mpi/mpi_call.h"
#include "hora/comm/mpi/mpi_communicator.h"
#include "hora/common/backoff.h"

namespace hora {
namespace {

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
  void Run(std::vector<std::string> argv, Communicator::SpawnInfo info) {
    thread_ = std::thread(
        [state = state_, argv = std::move(argv), info = std::move(info), count = count_] {
          std::vector<char*> args;
          for (size_t i = 1; i < argv.size(); ++i)
            args.push_back(const_cast<char*>(argv[i].c_str()));
          args.push_back(nullptr);
          std::vector<int> codes(static_cast<size_t>(count), MPI_SUCCESS);
          MPI_Comm joiners = MPI_COMM_NULL;
          // Every rank calls the (collective) spawn; only the first rank's
          // info counts, and a key it could not set leaves the placement to
          // MPI.
          MPI_Info keys = MPI_INFO_NULL;
          if (!info.empty() && MPI_Info_create(&keys) == MPI_SUCCESS) {
            for (const auto& [key, value] : info) MPI_Info_set(keys, key.c_str(), value.c_str());
          }
          Status status = MpiStatus(MPI_Comm_spawn(argv[0].c_str(), args.data(), count, keys, 0,
                                                   state->over->comm, &joiners, codes.data()),
                                    "MPI_Comm_spawn");
          if (keys != MPI_INFO_NULL) MPI_Info_free(&keys);
          for (int code : codes) {
            if (status.ok() && code != MPI_SUCCESS) status = MpiStatus(code, "a spawned process");
          }
          if (joiners != MPI_COMM_NULL) MPI_Comm_set_errhandler(joiners, MPI_ERRORS_RETURN);
          if (status.ok())
            status = Welcome(state->over->comm, joiners, state->hostname, state->cancel);
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
                                   const SpawnInfo& info, std::shared_ptr<Spawning>* out) {
  out->reset();
  if (!spawn_comm_) return Status::Internal("only a job's world can start processes");
  if (argv.empty() || count <= 0) {
    return Status::InvalidArgument("spawn: a command and a positive count are needed");
  }
  auto state = std::make_shared<MpiSpawning::State>();
  state->over = spawn_comm_;
  state->hostname = hostname_override_;
  auto spawning = std::make_shared<MpiSpawning>(state, count);
  spawning->Run(argv, info);
  *out = std::move(spawning);
  return Status::OK();
}

void MpiCommunicator::Agree(int* flag) {
  // Over the spawn's duplicate: the engine thread may still be using comm_.
  // (ULFM's agreement reports a failed rank of the world too, but agrees
  // on the flag all the same: the flag is what counts here.)
#if HORA_HAVE_ULFM
  MPIX_Comm_agree(spawn_comm_->comm, flag);
#else
  MPI_Allreduce(MPI_IN_PLACE, flag, 1, MPI_INT, MPI_MIN, spawn_comm_->comm);
#endif
}

Status MpiCommunicator::Merge(Spawning* spawning, std::unique_ptr<Communicator>* out) {
  out->reset();
  auto* mpi = dynamic_cast<MpiSpawning*>(spawning);
  if (mpi == nullptr) return Status::Internal("merge: not an MPI spawn");
  MPI_Comm joiners = MPI_COMM_NULL;
  Status status = mpi->Joiners(&joiners);
  // Only rank 0 talks to the new processes before they join, so only it
  // knows when one was lost first: agree, so that nobody enters the merge
  // alone. (A rank inside it, waiting for the others, would be freed only
  // by a revoke, whose forwarding to the lost process can block for good
  // in Open MPI 5.0, looking up how to reach it.)
  int ready = status.ok() ? 1 : 0;
  Agree(&ready);
  if (!ready) {
    if (joiners != MPI_COMM_NULL) MPI_Comm_free(&joiners);
    if (status.ok()) status = Status::Internal("a process that was to join was lost on the way");
    return status.WithContext("merge");
  }
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
  // A new process lost during the merge fails these on some ranks only:
  // agree.
  int ok = status.ok() ? 1 : 0;
  Agree(&ok);
  if (!ok) {
    if (status.ok()) status = Status::Internal("a process that was to join was lost on the way");
    return status.WithContext("merge");
  }
  // (nonblocking collectives, as the new processes' world starts)
  *out = std::move(result);
  return Status::OK();
}

}  // namespace hora
