#include "hora/core/runtime.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include "hora/algo/kernels/kernel_set.h"
#include "hora/comm/mpi/mpi_world.h"
#include "hora/comm/tcp/tcp_world.h"
#include "hora/common/build_config.h"
#include "hora/common/logging.h"
#include "hora/core/config.h"
#include "hora/cuda/device_runtime.h"
#if HORA_HAVE_NCCL
#include "hora/comm/nccl/nccl_communicator.h"
#endif

namespace hora {
namespace runtime {
namespace {

std::mutex g_mutex;
std::shared_ptr<Engine> g_engine;
bool g_was_shut_down = false;
std::shared_ptr<Communicator::Spawning> g_spawning;  // a growth under way
// The world re-formed without ranks that were lost: MPI_COMM_WORLD still
// names them.
std::atomic<bool> g_lost_ranks{false};
// This process left the job (Exclude): the others go on without it.
std::atomic<bool> g_left{false};
// HORA_FINALIZE_GRACE_SECONDS, as the last init read it.
std::atomic<double> g_finalize_grace_seconds{10.0};

// Open MPI's MPI_Finalize ends with a PMIx fence over the job's first world,
// the lost ranks included. Open MPI 5.0 mostly lets the survivors through,
// but not always: about one run in 40 of a 3-rank job that lost rank 0 left
// both survivors waiting in it for good (a loaded 2-core machine). So it
// gets a grace period, after which the process ends without it; its work
// is done, and the launcher sees the exit status the program ended with.
void FinalizeAfterLostRanks(int exit_code) {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mutex);
    const double grace = g_finalize_grace_seconds.load();
    if (done_cv.wait_for(lock, std::chrono::duration<double>(grace), [&] { return done; })) {
      return;
    }
    HORA_LOG(kWarning) << "MPI_Finalize has not returned after " << grace
                       << " s (Open MPI waits for the ranks lost earlier in this job); this "
                          "process ends without it, with exit status "
                       << exit_code;
    std::fflush(nullptr);
    _exit(exit_code);
  });
  FinalizeMpiIfOwned();
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  done_cv.notify_all();
  watchdog.join();
}
// A replacement process between Init and Join: its place to be, and the
// world options it joins with.
bool g_joining = false;
Topology g_place;
MpiWorldOptions g_join_options;
TcpWorldOptions g_join_tcp;  // (its rendezvous set: the process joins over TCP)

// With g_mutex held: starts the engine of a world formed in place (after a
// loss, a growth or a join) and makes it the process's; `seconds` gets the
// time since `began`.
Status StartWorld(std::unique_ptr<Communicator> comm, const char* context,
                  std::chrono::steady_clock::time_point began, double* seconds) {
  Config config;
  HORA_RETURN_IF_ERROR(Config::FromEnvironment(&config));
  SetLogRank(comm->rank());
  std::unique_ptr<Engine> engine;
  HORA_RETURN_IF_ERROR(Engine::Start(std::move(comm), config, &engine).WithContext(context));
  g_engine = std::move(engine);
  g_was_shut_down = false;
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return Status::OK();
}

// With g_mutex held: gives up the growth under way. A spawn that has not
// ended may be stuck starting a process (on a host that went away): it is
// left behind, as Reform leaves it (its processes are told or ended once
// it ends), rather than waited for.
void DropGrowthLocked() {
  if (!g_spawning) return;
  if (g_spawning->Finished()) g_spawning->Cancel();
  g_spawning.reset();
}

}  // namespace

Status Init(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_engine) return Status::OK();
  Config config;
  HORA_RETURN_IF_ERROR(Config::FromEnvironment(&config));
  SetLogLevel(config.log_level);
  SetLogTime(!config.log_hide_time);
  g_finalize_grace_seconds = config.finalize_grace_seconds;
  if (options.dynamic_process_sets) config.dynamic_process_sets = true;
  MpiWorldOptions world;
  world.has_comm = options.has_comm;
  world.comm_handle = options.comm_handle;
  world.ranks = options.ranks;
  world.hostname = config.hostname;
  if (g_joining) return Status::OK();
  if (!config.rendezvous.empty()) {
    // horarun's own launch: hora's TCP transport, no MPI runtime.
    TcpWorldOptions tcp;
    tcp.rendezvous = config.rendezvous;
    tcp.cookie = config.rendezvous_cookie;
    tcp.process_id = config.process_id;
    tcp.hostname = config.hostname;
    if (config.elastic_joiner) {
      HORA_RETURN_IF_ERROR(StartTcpJoining(tcp, &g_place).WithContext("hora.init"));
      g_joining = true;
      g_join_tcp = tcp;
      SetLogRank(g_place.rank);
      return Status::OK();
    }
    std::unique_ptr<Communicator> comm;
    HORA_RETURN_IF_ERROR(CreateTcpWorld(tcp, &comm).WithContext("hora.init"));
    SetLogRank(comm->rank());
    std::unique_ptr<Engine> engine;
    HORA_RETURN_IF_ERROR(Engine::Start(std::move(comm), config, &engine).WithContext("hora.init"));
    g_engine = std::move(engine);
    g_was_shut_down = false;
    return Status::OK();
  }
  bool joining = false;
  HORA_RETURN_IF_ERROR(StartJoining(world, &joining, &g_place).WithContext("hora.init"));
  if (joining) {
    g_joining = true;
    g_join_options = world;
    SetLogRank(g_place.rank);
    return Status::OK();
  }
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Engine> engine;
  Status status = CreateMpiWorld(world, &comm);
  if (status.ok()) {
    SetLogRank(comm->rank());
    status = Engine::Start(std::move(comm), config, &engine);
  }
  if (!status.ok()) return status.WithContext("hora.init");
  g_engine = std::move(engine);
  g_was_shut_down = false;
  return Status::OK();
}

void Shutdown() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_spawning) g_spawning->Cancel();
    g_spawning.reset();
    engine.swap(g_engine);
    if (engine) g_was_shut_down = true;
  }
  if (engine) Engine::Release(std::move(engine));
}

Status Reform(double* seconds) {
  const auto began = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine) {
    return Status::InvalidArgument("hora.reform: hora is not running; call hora.init() first");
  }
  std::shared_ptr<Engine> old;
  old.swap(g_engine);
  g_was_shut_down = true;  // until the new engine runs
  g_spawning.reset();      // the revoke below ends it, or it is left behind
  old->Shutdown();
  std::unique_ptr<Communicator> comm = old->TakeCommunicator();
  if (!comm) {
    Engine::Release(std::move(old));
    return Status::Internal(
        "hora.reform: the engine's thread is still inside a transport call with the lost rank");
  }
  // The other survivors may still be blocked in a call with the lost rank.
  comm->Revoke();
  std::unique_ptr<Communicator> survivors;
  HORA_RETURN_IF_ERROR(comm->Shrink(&survivors).WithContext("hora.reform"));
  g_lost_ranks = true;
  return StartWorld(std::move(survivors), "hora.reform", began, seconds);
}

void CancelGrowth() {
  std::lock_guard<std::mutex> lock(g_mutex);
  DropGrowthLocked();
}

Status Exclude(const std::vector<int>& leaving, bool* left, double* seconds) {
  const auto began = std::chrono::steady_clock::now();
  *left = false;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine) {
    return Status::InvalidArgument("hora.exclude: hora is not running; call hora.init() first");
  }
  const int size = g_engine->topology().size;
  std::set<int> distinct;
  for (int r : leaving) {
    if (r < 0 || r >= size) {
      return Status::InvalidArgument("hora.exclude: rank " + std::to_string(r) +
                                     " is not in the world of " + std::to_string(size) +
                                     " rank(s)");
    }
    distinct.insert(r);
  }
  if (static_cast<int>(distinct.size()) == size) {
    return Status::InvalidArgument("hora.exclude: every rank of the world would leave it");
  }
  std::shared_ptr<Engine> old;
  old.swap(g_engine);
  g_was_shut_down = true;  // until the new engine runs
  DropGrowthLocked();
  // Every rank stops its engine here, at the same point of the program.
  old->Shutdown();
  std::unique_ptr<Communicator> comm = old->TakeCommunicator();
  Engine::Release(std::move(old));
  if (!comm) return Status::Internal("hora.exclude: the engine's thread did not stop");
  std::unique_ptr<Communicator> rest;
  HORA_RETURN_IF_ERROR(comm->Exclude(std::vector<int>(distinct.begin(), distinct.end()), &rest)
                           .WithContext("hora.exclude"));
  // MPI_Finalize would wait for the ranks on the other side.
  g_lost_ranks = true;
  if (!rest) {
    *left = true;
    g_left = true;
    *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    return Status::OK();
  }
  return StartWorld(std::move(rest), "hora.exclude", began, seconds);
}

Status StartGrowth(const std::vector<std::string>& argv, int count,
                   const Communicator::SpawnInfo& info) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine) {
    return Status::InvalidArgument(
        "hora.start_growth: hora is not running; call hora.init() first");
  }
  if (g_spawning) return Status::InvalidArgument("hora.start_growth: a growth is under way");
  return g_engine->communicator()->StartSpawn(argv, count, info, &g_spawning);
}

GrowthState Growth() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_spawning) return GrowthState::kNone;
  if (!g_spawning->Finished()) return GrowthState::kStarting;
  return g_spawning->result().ok() ? GrowthState::kReady : GrowthState::kFailed;
}

Status Grow(double* seconds) {
  const auto began = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine || !g_spawning) {
    return Status::InvalidArgument("hora.grow: no growth was started");
  }
  std::shared_ptr<Communicator::Spawning> spawning;
  spawning.swap(g_spawning);
  // The world of both is made beside the running engine: when a new
  // process was lost on the way, that engine simply goes on.
  std::unique_ptr<Communicator> grown;
  HORA_RETURN_IF_ERROR(
      g_engine->communicator()->Merge(spawning.get(), &grown).WithContext("hora.grow"));
  std::shared_ptr<Engine> old;
  old.swap(g_engine);
  g_was_shut_down = true;  // until the new engine runs
  Engine::Release(std::move(old));
  return StartWorld(std::move(grown), "hora.grow", began, seconds);
}

bool Joining() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_joining;
}

Status Join(double* seconds) {
  const auto began = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_joining) return Status::InvalidArgument("hora.join: this process is not waiting to join");
  std::unique_ptr<Communicator> comm;
  HORA_RETURN_IF_ERROR((g_join_tcp.rendezvous.empty() ? FinishJoining(g_join_options, &comm)
                                                      : FinishTcpJoining(g_join_tcp, &comm))
                           .WithContext("hora.join"));
  g_joining = false;
  return StartWorld(std::move(comm), "hora.join", began, seconds);
}

Status CurrentTopology(Topology* out) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_joining) {
      *out = g_place;
      return Status::OK();
    }
  }
  std::shared_ptr<Engine> engine;
  HORA_RETURN_IF_ERROR(Current(&engine));
  *out = engine->topology();
  return Status::OK();
}

bool IsInitialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<bool>(g_engine) || g_joining;
}

Status Current(std::shared_ptr<Engine>* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine && g_joining) {
    return Status::InvalidArgument(
        "this process replaces a lost rank and joins the world in hvd.elastic.run (at the "
        "world's next commit); it cannot take part in collectives before");
  }
  if (!g_engine) {
    return Status::InvalidArgument(
        g_was_shut_down ? "hora has been shut down; call hora.init() again before using it"
                        : "hora has not been initialized; call hora.init() first");
  }
  *out = g_engine;
  return Status::OK();
}

void FinalizeProcess(int exit_code) {
  Shutdown();
  // After a lost rank or a stall shutdown, MPI_Finalize would wait for the
  // ranks that are gone or stuck: exit without it, and let the launcher end
  // the job.
  if (Engine::JobBroken()) {
    HORA_LOG(kDebug) << "not finalizing MPI: the job stopped on an error";
    return;
  }
  if (g_left) {
    // MPI_Finalize would wait for the ranks that go on training (Open MPI
    // fences every process of the job); they no longer count on this one.
    HORA_LOG(kDebug) << "not finalizing MPI: this process left the job";
    return;
  }
  if (g_lost_ranks) {
    FinalizeAfterLostRanks(exit_code);
    return;
  }
  FinalizeMpiIfOwned();
}

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.text["version"] = HORA_VERSION;
  info.text["mpi_source"] = HORA_MPI_SOURCE;
  info.text["mpi_library_path"] = MpiLibraryPath();
  info.text["mpi_library"] = MpiLibraryVersion();
  info.text["mpi_bin_dir"] = HORA_MPI_BIN_DIR;
  info.text["compiler"] = HORA_COMPILER;
  info.flags["mpi_built"] = true;
  info.flags["cuda_built"] = static_cast<bool>(HORA_HAVE_CUDA);
  info.flags["nccl_built"] = static_cast<bool>(HORA_HAVE_NCCL);
  // CUDA and NCCL versions (compiled against, and loaded now), the GPU
  // architectures compiled for and the devices visible; absent without CUDA.
  for (const auto& item : gpu::VersionInfo()) info.text[item.first] = item.second;
#if HORA_HAVE_NCCL
  for (const auto& item : gpu::NcclVersionInfo()) info.text[item.first] = item.second;
#endif
  for (const auto& item : KernelAvailability()) info.cpu_kernels[item.first] = item.second;
  return info;
}

}  // namespace runtime
}  // namespace hora
