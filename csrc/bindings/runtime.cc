// The runtime's Python face: conversions only (core/runtime decides).
#include "runtime.h"

#include <pybind11/stl.h>

#include "errors.h"
#include "hora/core/runtime.h"
#include "waiting.h"

namespace py = pybind11;

namespace hora {
namespace {

void Init(py::object comm_handle, py::object ranks, bool dynamic_process_sets) {
  runtime::InitOptions options;
  options.dynamic_process_sets = dynamic_process_sets;
  if (!comm_handle.is_none()) {
    options.has_comm = true;
    options.comm_handle = comm_handle.cast<intptr_t>();
  }
  if (!ranks.is_none()) options.ranks = ranks.cast<std::vector<int>>();
  Status status;
  {
    py::gil_scoped_release release;
    status = runtime::Init(options);
  }
  if (!status.ok()) ThrowStatus(status);
}

void Shutdown() {
  {
    py::gil_scoped_release release;
    runtime::Shutdown();
  }
  ReleaseFinishedOrphans();  // shutdown completed every collective in flight
}

Topology Topo() {
  Topology topology;
  Status status = runtime::CurrentTopology(&topology);
  if (!status.ok()) ThrowStatus(status);
  return topology;
}

// Waits for an add/remove-process-set change (collective over the job).
std::shared_ptr<Work> WaitForChange(Status submitted, std::shared_ptr<Work> work) {
  if (!submitted.ok()) ThrowStatus(submitted);
  Status status = WaitInterruptibly(*work);
  if (!status.ok()) ThrowStatus(status);
  return work;
}

py::dict BuildInfo() {
  const runtime::BuildInfo built = runtime::GetBuildInfo();
  py::dict info;
  for (const auto& item : built.text) info[py::str(item.first)] = item.second;
  for (const auto& item : built.flags) info[py::str(item.first)] = item.second;
  py::dict kernels;
  for (const auto& item : built.cpu_kernels) kernels[py::str(item.first)] = item.second;
  info["cpu_kernels"] = kernels;
  return info;
}

}  // namespace

std::shared_ptr<Engine> CurrentEngine() {
  std::shared_ptr<Engine> engine;
  Status status = runtime::Current(&engine);
  if (!status.ok()) ThrowStatus(status);
  return engine;
}

Config CurrentConfig() {
  std::shared_ptr<Engine> engine;
  if (runtime::Current(&engine).ok()) return engine->config();
  Config config;
  Status status = Config::FromEnvironment(&config);
  if (!status.ok()) ThrowStatus(status);
  return config;
}

void RegisterRuntime(py::module_& m) {
  m.def("init", &Init, py::arg("comm_handle") = py::none(), py::arg("ranks") = py::none(),
        py::arg("dynamic_process_sets") = false);
  // Process sets: (ranks, this rank's rank in the set or -1) of set `id`.
  m.def("process_set_info", [](int32_t id) {
    ProcessSetInfo info;
    Status status = CurrentEngine()->process_sets().Find(id, &info);
    if (!status.ok()) ThrowStatus(status);
    return py::make_tuple(info.ranks, info.rank);
  });
  // Raises what a collective called `what` on set `id` (with a broadcast's
  // root, a job rank) would raise at submission; the TensorFlow adapter
  // asks while tracing a graph, where the submission comes only later.
  m.def(
      "check_process_set_call",
      [](int32_t id, std::optional<int> root, const std::string& what) {
        ProcessSetRoute route;
        Status status = CurrentEngine()->process_sets().Route(id, root, &route);
        if (!status.ok()) ThrowStatus(status.WithContext(what));
      },
      py::arg("id"), py::arg("root"), py::arg("what"));
  m.def("process_sets", [] {
    py::dict sets;
    for (const auto& info : CurrentEngine()->process_sets().All())
      sets[py::int_(info.id)] = info.ranks;
    return sets;
  });
  m.def("dynamic_process_sets", [] { return CurrentEngine()->config().dynamic_process_sets; });
  // Also before init (an optimizer may be wrapped first): then read now.
  m.def("gradient_bucket_bytes", [] { return CurrentConfig().gradient_bucket_bytes; });
  m.def("exact_reduce_gradients", [] { return CurrentConfig().exact_reduce_gradients; });
  m.def("add_process_set", [](const std::vector<int>& ranks) {
    std::shared_ptr<Engine> engine = CurrentEngine();
    std::shared_ptr<Work> work;
    Status submitted = engine->AddProcessSet(ranks, &work);
    return WaitForChange(submitted, work)->process_set_id;
  });
  m.def("remove_process_set", [](int32_t id) {
    std::shared_ptr<Engine> engine = CurrentEngine();
    std::shared_ptr<Work> work;
    Status submitted = engine->RemoveProcessSet(id, &work);
    WaitForChange(submitted, work);
  });
  m.def("shutdown", &Shutdown);
  m.def("reform", [] {
    Status status;
    double seconds = 0.0;
    {
      py::gil_scoped_release release;
      status = runtime::Reform(&seconds);
    }
    ReleaseFinishedOrphans();  // the old engine completed every collective in flight
    if (!status.ok()) ThrowStatus(status);
    return seconds;
  });
  m.def(
      "exclude",
      [](const std::vector<int>& leaving) {
        Status status;
        bool left = false;
        double seconds = 0.0;
        {
          py::gil_scoped_release release;
          status = runtime::Exclude(leaving, &left, &seconds);
        }
        ReleaseFinishedOrphans();
        if (!status.ok()) ThrowStatus(status);
        return py::make_tuple(left, seconds);
      },
      py::arg("leaving"));
  m.def(
      "start_growth",
      [](const std::vector<std::string>& argv, int count,
         const std::vector<std::pair<std::string, std::string>>& info) {
        Status status = runtime::StartGrowth(argv, count, info);
        if (!status.ok()) ThrowStatus(status);
      },
      py::arg("argv"), py::arg("count"),
      py::arg("info") = std::vector<std::pair<std::string, std::string>>());
  m.def("cancel_growth", [] {
    py::gil_scoped_release release;
    runtime::CancelGrowth();
  });
  m.def("growth_state", [] {
    const char* names[] = {"none", "starting", "ready", "failed"};
    return std::string(names[static_cast<int>(runtime::Growth())]);
  });
  m.def("grow", [] {
    Status status;
    double seconds = 0.0;
    {
      py::gil_scoped_release release;
      status = runtime::Grow(&seconds);
    }
    ReleaseFinishedOrphans();
    if (!status.ok()) ThrowStatus(status);
    return seconds;
  });
  m.def("joining", &runtime::Joining);
  m.def("join_world", [] {
    Status status;
    double seconds = 0.0;
    {
      py::gil_scoped_release release;
      status = runtime::Join(&seconds);
    }
    if (!status.ok()) ThrowStatus(status);
    return seconds;
  });
  m.def("is_initialized", &runtime::IsInitialized);
  m.def("rank", [] { return Topo().rank; });
  m.def("size", [] { return Topo().size; });
  m.def("local_rank", [] { return Topo().local_rank; });
  m.def("local_size", [] { return Topo().local_size; });
  m.def("cross_rank", [] { return Topo().cross_rank; });
  m.def("cross_size", [] { return Topo().cross_size; });
  m.def("is_homogeneous", [] { return Topo().homogeneous; });
  m.def("transport", [] { return CurrentEngine()->TransportDescription(); });
  m.def(
      "finalize_mpi",
      [](int exit_code) {
        {
          py::gil_scoped_release release;
          runtime::FinalizeProcess(exit_code);
        }
        ReleaseFinishedOrphans();
      },
      py::arg("exit_code") = 0);
  m.def("build_info", &BuildInfo);
  m.def(
      "start_timeline",
      [](const std::string& path, bool mark_cycles) {
        Status status = CurrentEngine()->StartTimeline(path, mark_cycles);
        if (!status.ok()) ThrowStatus(status);
      },
      py::arg("path"), py::arg("mark_cycles") = false);
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
      history.append(py::make_tuple(
          change.cycle, change.parameters.fusion_threshold_bytes, change.parameters.cycle_time_ms,
          change.parameters.response_cache, change.parameters.hierarchical));
    }
    out["history"] = history;
    out["autotuning"] = engine->autotuning();
    return out;
  });
}

}  // namespace hora
