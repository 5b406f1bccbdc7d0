#pragma once
// How Python waits for collectives, and what happens to the ones it stops
// waiting for.
#include <memory>
#include <optional>

#include "hora/core/work.h"
#include "tensor_arg.h"

namespace hora {

// Waits for `work` without holding the GIL, taking it back every 100 ms to
// run Python's signal handlers: Ctrl-C (or any handler that raises) ends
// the wait with that exception, and the collective stays in flight.
// Called with the GIL held.
Status WaitInterruptibly(Work& work);

// Takes over the views of a collective whose Python handle is gone while
// it is still in flight, so the caller's memory stays alive until the
// engine is done with it (the caller is never blocked). GIL held.
void Adopt(std::shared_ptr<Work> work, std::optional<TensorArg> input,
           std::optional<TensorArg> output);

// Lets go of adopted collectives that have finished, logging the error of
// any that failed. Called with the GIL held, on every submission and at
// shutdown.
void ReleaseFinishedOrphans();
// Logs the failure of a finished collective whose handle the caller dropped
// without waiting on it (nothing when it succeeded).
void ReportDroppedFailure(Work& work);

}  // namespace hora
