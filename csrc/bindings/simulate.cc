// python -m hora.bench negotiation: the negotiation of many ranks, each a
// thread of this process over the in-process transport (comm/local). Every
// rank runs the real Controller (response cache, coordinator on rank 0) and
// plans each negotiated collective as its executor would; nothing moves
// tensor bytes. It measures what one cycle costs in CPU on the coordinator
// and on another rank as the number of ranks grows; the transport's own
// latency is the in-process one, not a network's.
#include <pybind11/pybind11.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"
#include "hora/comm/local/local_communicator.h"
#include "hora/core/collective_plan.h"
#include "hora/core/config.h"
#include "hora/core/controller.h"
#include "hora/core/timeline.h"

namespace py = pybind11;

namespace hora {
namespace {

double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct RankTimes {
  std::vector<double> wall;  // per step: until every tensor of the step is decided
  std::vector<double> cpu;   // this thread's CPU time over the same span
  std::vector<int> cycles;   // cycles the step took
};

// One step: submit `tensors` allreduces and run cycles until all are
// decided. Step 0 goes through the coordinator; later steps hit the cache.
Status RunRank(Communicator* comm, int tensors, int steps, RankTimes* times) {
  Config config;
  config.stall_check = false;
  Timeline timeline;
  Controller controller(comm, config, &timeline);
  for (int step = 0; step < steps; ++step) {
    std::vector<Request> requests(static_cast<size_t>(tensors));
    for (int t = 0; t < tensors; ++t) {
      Request& r = requests[static_cast<size_t>(t)];
      r.rank = comm->rank();
      r.name = "allreduce.layer" + std::to_string(t) + ".weight";
      r.shape = {256, 64 + t % 7};
    }
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = ThreadCpuSeconds();
    int decided = 0, cycles = 0;
    while (decided < tensors) {
      if (++cycles > 100) return Status::Internal("negotiation did not finish in 100 cycles");
      CycleResult result;
      HORA_RETURN_IF_ERROR(
          controller.RunCycle(std::move(requests), false, false, true, false, &result));
      requests.clear();
      if (!result.abort.ok()) return result.abort;
      for (const Response& response : result.responses) {
        if (response.is_error()) return Status::Internal(response.error);
        const CollectivePlan plan =
            PlanCollective(response, response.shape, comm->rank(), comm->size());
        (void)plan;
      }
      decided += static_cast<int>(result.responses.size());
    }
    times->cpu.push_back(ThreadCpuSeconds() - cpu_start);
    times->wall.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    times->cycles.push_back(cycles);
  }
  return Status::OK();
}

py::dict Simulate(int ranks, int tensors, int steps) {
  if (ranks < 1 || ranks > 4096) throw py::value_error("ranks must lie in 1..4096");
  if (tensors < 1 || steps < 2) throw py::value_error("need at least 1 tensor and 2 steps");
  std::vector<RankTimes> times(static_cast<size_t>(ranks));
  std::vector<Status> results(static_cast<size_t>(ranks));
  {
    py::gil_scoped_release release;
    std::vector<std::unique_ptr<LocalCommunicator>> comms = LocalCommunicator::CreateWorld(ranks);
    std::vector<std::thread> threads;
    threads.reserve(static_cast<size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        results[static_cast<size_t>(r)] = RunRank(comms[static_cast<size_t>(r)].get(), tensors,
                                                  steps, &times[static_cast<size_t>(r)]);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (int r = 0; r < ranks; ++r) {
    if (!results[static_cast<size_t>(r)].ok()) {
      ThrowStatus(Status::Internal("simulated rank " + std::to_string(r) + ": " +
                                   results[static_cast<size_t>(r)].message()));
    }
  }
  auto as_list = [](const auto& values) {
    py::list out;
    for (const auto& v : values) out.append(v);
    return out;
  };
  py::dict out;
  for (int r : {0, ranks - 1}) {
    const std::string who = r == 0 ? "coordinator" : "last_rank";
    out[py::str(who + "_wall")] = as_list(times[static_cast<size_t>(r)].wall);
    out[py::str(who + "_cpu")] = as_list(times[static_cast<size_t>(r)].cpu);
    out[py::str(who + "_cycles")] = as_list(times[static_cast<size_t>(r)].cycles);
  }
  return out;
}

}  // namespace

void RegisterSimulation(py::module_& m) {
  m.def("simulate_negotiation", &Simulate, py::arg("ranks"), py::arg("tensors"), py::arg("steps"),
        "Runs `steps` steps of `tensors` allreduces through the negotiation of `ranks` "
        "thread-ranks over the in-process transport; per step, the wall and CPU seconds and "
        "the cycles of rank 0 and of the last rank (step 0 goes through the coordinator, the "
        "others hit the response cache).");
}

}  // namespace hora
