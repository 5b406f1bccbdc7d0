#include "waiting.h"

#include <pybind11/pybind11.h>

#include <chrono>
#include <vector>

#include "hora/common/logging.h"

namespace py = pybind11;

namespace hora {
namespace {

constexpr std::chrono::milliseconds kSignalCheckInterval{100};
// How long a caller yields its core to a hot engine before it sleeps.
constexpr std::chrono::microseconds kYieldLimit{50};

struct Orphan {
  std::shared_ptr<Work> work;
  std::optional<TensorArg> input;
  std::optional<TensorArg> output;
};

// Only touched with the GIL held. Never destroyed: at interpreter exit its
// views could no longer be released.
std::vector<std::unique_ptr<Orphan>>& Orphans() {
  static auto* orphans = new std::vector<std::unique_ptr<Orphan>>();
  return *orphans;
}

}  // namespace

Status WaitInterruptibly(Work& work) {
  Status status;
  if (work.Poll()) return work.Wait();
  bool done;
  {
    py::gil_scoped_release release;
    done = work.YieldUntilDone(kYieldLimit);
  }
  while (!done) {
    {
      py::gil_scoped_release release;
      done = work.WaitFor(kSignalCheckInterval, &status);
    }
    if (!done && PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  // A dropped handle whose collective failed while this caller waited is
  // reported now, not only at the next submission.
  ReleaseFinishedOrphans();
  return work.Wait();
}

void Adopt(std::shared_ptr<Work> work, std::optional<TensorArg> input,
           std::optional<TensorArg> output) {
  Orphans().push_back(
      std::unique_ptr<Orphan>(new Orphan{std::move(work), std::move(input), std::move(output)}));
}

void ReportDroppedFailure(Work& work) {
  const Status status = work.Wait();  // done: returns at once
  if (!status.ok()) {
    HORA_LOG(kWarning) << "a collective whose handle was dropped failed: " << status.message();
  }
}

void ReleaseFinishedOrphans() {
  std::vector<std::unique_ptr<Orphan>>& orphans = Orphans();
  if (orphans.empty()) return;
  size_t kept = 0;
  for (size_t i = 0; i < orphans.size(); ++i) {
    if (!orphans[i]->work->Poll()) {
      if (kept != i) orphans[kept] = std::move(orphans[i]);
      ++kept;
      continue;
    }
    ReportDroppedFailure(*orphans[i]->work);
  }
  orphans.resize(kept);
}

}  // namespace hora
