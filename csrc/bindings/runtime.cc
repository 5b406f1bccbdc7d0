#include "runtime.h"

#include <pybind11/stl.h>

#include <dlfcn.h>
#include <stdlib.h>
#include <mpi.h>

#include <mutex>
#include <type_traits>

#include "errors.h"
#include "hora/algo/kernels/kernel_set.h"
#include "hora/comm/mpi/mpi_communicator.h"
#include "hora/common/build_config.h"
#include "hora/common/logging.h"
#include "hora/core/config.h"
#include "hora/gpu/gpu_backend.h"

namespace py = pybind11;

namespace hora {
namespace {

std::mutex g_mutex;
std::shared_ptr<Engine> g_engine;
bool g_was_shut_down = false;

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

void Init(py::object comm_handle, py::object ranks) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_engine) return;
  Config config;
  Status status = Config::FromEnvironment(&config);
  if (!status.ok()) ThrowStatus(status);
  SetLogLevel(config.log_level);
  MpiInitOptions options;
  if (!comm_handle.is_none()) options.comm = CommFromHandle<MPI_Comm>(comm_handle.cast<intptr_t>());
  if (!ranks.is_none()) options.ranks = ranks.cast<std::vector<int>>();
  options.hostname = config.hostname;
  std::unique_ptr<MpiCommunicator> comm;
  std::unique_ptr<Engine> engine;
  {
    py::gil_scoped_release release;
    status = MpiCommunicator::Create(options, &comm);
    if (status.ok()) {
      SetLogRank(comm->rank());
      status = Engine::Start(std::move(comm), config, &engine);
    }
  }
  if (!status.ok()) ThrowStatus(status.WithContext("hora.init"));
  g_engine = std::move(engine);
  g_was_shut_down = false;
}

void Shutdown() {
  std::shared_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    engine.swap(g_engine);
    if (engine) g_was_shut_down = true;
  }
  if (engine) {
    py::gil_scoped_release release;
    engine->Shutdown();
    engine.reset();
  }
}

const Topology& Topo() { return CurrentEngine()->topology(); }

py::dict BuildInfo() {
  py::dict info;
  info["version"] = HORA_VERSION;
  info["mpi_built"] = true;
  info["mpi_source"] = HORA_MPI_SOURCE;
  // Where libmpi was actually loaded from: for the PyPI wheel the build-time
  // prefix was a temporary build environment that no longer exists.
  Dl_info loaded{};
  std::string library_path;
  if (dladdr(reinterpret_cast<void*>(&MPI_Init), &loaded) && loaded.dli_fname) {
    char* resolved = realpath(loaded.dli_fname, nullptr);
    library_path = resolved ? resolved : loaded.dli_fname;
    free(resolved);
  }
  info["mpi_library_path"] = library_path;
  info["mpi_library"] = MpiCommunicator::LibraryVersion();
  info["mpi_bin_dir"] = HORA_MPI_BIN_DIR;
  info["cuda_built"] = static_cast<bool>(HORA_HAVE_CUDA);
  info["nccl_built"] = static_cast<bool>(HORA_HAVE_NCCL);
  // CUDA and NCCL versions (compiled against, and loaded now), the GPU
  // architectures compiled for and the devices visible; absent without CUDA.
  for (const auto& item : gpu::VersionInfo()) info[py::str(item.first)] = item.second;
  info["compiler"] = HORA_COMPILER;
  py::dict kernels;  // compiled-in CPU kernel set -> whether this CPU runs it
  for (const auto& item : KernelAvailability()) kernels[py::str(item.first)] = item.second;
  info["cpu_kernels"] = kernels;
  return info;
}

}  // namespace

std::shared_ptr<Engine> CurrentEngine() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_engine) {
    ThrowValueError(g_was_shut_down
                        ? "hora has been shut down; call hora.init() again before using it"
                        : "hora has not been initialized; call hora.init() first");
  }
  return g_engine;
}

void RegisterRuntime(py::module_& m) {
  m.def("init", &Init, py::arg("comm_handle") = py::none(), py::arg("ranks") = py::none());
  m.def("shutdown", &Shutdown);
  m.def("is_initialized", [] {
    std::lock_guard<std::mutex> lock(g_mutex);
    return static_cast<bool>(g_engine);
  });
  m.def("rank", [] { return Topo().rank; });
  m.def("size", [] { return Topo().size; });
  m.def("local_rank", [] { return Topo().local_rank; });
  m.def("local_size", [] { return Topo().local_size; });
  m.def("cross_rank", [] { return Topo().cross_rank; });
  m.def("cross_size", [] { return Topo().cross_size; });
  m.def("is_homogeneous", [] { return Topo().homogeneous; });
  m.def("transport", [] { return CurrentEngine()->TransportDescription(); });
  m.def("finalize_mpi", [] {
    Shutdown();
    // After a lost rank or a stall shutdown, MPI_Finalize would wait for the
    // ranks that are gone or stuck: exit without it, and let the launcher
    // end the job.
    if (Engine::JobBroken()) {
      HORA_LOG(kDebug) << "not finalizing MPI: the job stopped on an error";
      return;
    }
    MpiCommunicator::FinalizeIfOwned();
  });
  m.def("build_info", &BuildInfo);
  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    Status status = CurrentEngine()->StartTimeline(path, mark_cycles);
    if (!status.ok()) ThrowStatus(status);
  }, py::arg("path"), py::arg("mark_cycles") = false);
  m.def("stop_timeline", [] { CurrentEngine()->StopTimeline(); });
  // The engine settings in effect and their changes (autotuning), for tests
  // and the benchmark.
  m.def("engine_parameters", [] {
    std::shared_ptr<Engine> engine = CurrentEngine();
    const EngineParameters now = engine->parameters();
    py::dict out;
    out["fusion_threshold_bytes"] = now.fusion_threshold_bytes;
    out["cycle_time_ms"] = now.cycle_time_ms;
    out["response_cache"] = now.response_cache;
    out["hierarchical"] = now.hierarchical;
    py::list history;
    for (const auto& change : engine->parameter_history()) {
      history.append(py::make_tuple(change.cycle, change.parameters.fusion_threshold_bytes,
                                    change.parameters.cycle_time_ms,
                                    change.parameters.response_cache,
                                    change.parameters.hierarchical));
    }
    out["history"] = history;
    out["autotuning"] = engine->autotuning();
    return out;
  });
}

}  // namespace hora
