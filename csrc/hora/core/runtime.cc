#include "hora/core/runtime.h"

#include <chrono>
#include <mutex>

#include "hora/algo/kernels/kernel_set.h"
#include "hora/comm/mpi/mpi_world.h"
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

}  // namespace

Status Init(const InitOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_engine) return Status::OK();
  Config config;
  HORA_RETURN_IF_ERROR(Config::FromEnvironment(&config));
  SetLogLevel(config.log_level);
  if (options.dynamic_process_sets) config.dynamic_process_sets = true;
  MpiWorldOptions world;
  world.has_comm = options.has_comm;
  world.comm_handle = options.comm_handle;
  world.ranks = options.ranks;
  world.hostname = config.hostname;
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
  Config config;
  HORA_RETURN_IF_ERROR(Config::FromEnvironment(&config));
  SetLogRank(survivors->rank());
  std::unique_ptr<Engine> engine;
  HORA_RETURN_IF_ERROR(
      Engine::Start(std::move(survivors), config, &engine).WithContext("hora.reform"));
  g_engine = std::move(engine);
  g_was_shut_down = false;
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  return Status::OK();
}

bool IsInitialized() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<bool>(g_engine);
}

Status Current(std::shared_ptr<Engine>* out) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine) {
    return Status::InvalidArgument(
        g_was_shut_down ? "hora has been shut down; call hora.init() again before using it"
                        : "hora has not been initialized; call hora.init() first");
  }
  *out = g_engine;
  return Status::OK();
}

void FinalizeProcess() {
  Shutdown();
  // After a lost rank or a stall shutdown, MPI_Finalize would wait for the
  // ranks that are gone or stuck: exit without it, and let the launcher end
  // the job.
  if (Engine::JobBroken()) {
    HORA_LOG(kDebug) << "not finalizing MPI: the job stopped on an error";
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
