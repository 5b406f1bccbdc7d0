"""The words of the usage errors and warnings every torch
``DistributedOptimizer`` flavour (replicated, sharded) raises, kept in one
place so they cannot drift apart."""

from __future__ import annotations

import warnings

from hora.common.exceptions import HoraUsageError


def too_many_passes(parameter: str, passes: int) -> HoraUsageError:
    return HoraUsageError(
        f"the gradient of '{parameter}' was computed more than "
        f"backward_passes_per_step={passes} times before "
        f"optimizer.step(); call step() after every {passes} "
        f"backward pass(es), or raise backward_passes_per_step to accumulate more "
        f"passes locally")


def zero_grad_while_reducing() -> HoraUsageError:
    return HoraUsageError(
        "optimizer.zero_grad() was called after loss.backward() but before "
        "optimizer.step() or optimizer.synchronize(); the gradients are being reduced "
        "across ranks at this moment. Call zero_grad() before backward() or after step().")


def warn_step_after_synchronize() -> None:
    # Horovod's words, which scripts and tests match on; hora does not
    # reduce the already reduced gradients again
    warnings.warn(
        "optimizer.step() called without optimizer.skip_synchronize() context after "
        "optimizer.synchronize(). This can cause training slowdown. You may want to "
        "consider using optimizer.skip_synchronize() context if you use "
        "optimizer.synchronize() in your code.", stacklevel=3)
