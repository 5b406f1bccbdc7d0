"""What every torch DistributedOptimizer flavour (replicated, sharded)
shares: the gradient hook it registers and the switch that lets ``step()``
skip the reduction."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, Callable

import torch


def gradient_ready_hook(optimizer: Any) -> Callable[[torch.Tensor], None]:
    """A ``register_post_accumulate_grad_hook`` hook that hands each
    parameter whose gradient autograd has just accumulated to
    ``optimizer._hora_on_grad``. It holds the optimizer weakly, so that
    hooks left on a model do not keep a dropped optimizer alive."""
    this = weakref.ref(optimizer)

    def hook(param: torch.Tensor) -> None:
        optimizer = this()
        if optimizer is not None:
            optimizer._hora_on_grad(param)

    return hook


# The optimizer classes are mixed in before the wrapped torch.optim.Optimizer
# subclass (whose methods they extend through super()); to a type checker
# that class is unknown, since torch is read untyped.
_WrappedOptimizer: Any = object


class SynchronizeSwitch(_WrappedOptimizer):
    """Mixed into the optimizer classes: ``skip_synchronize()``. They set
    ``_hora_should_synchronize = True`` at wrapping."""

    _hora_should_synchronize: bool

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Context manager under which ``step()`` does not reduce gradients,
        for use after an explicit :meth:`synchronize`::

            optimizer.synchronize()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            with optimizer.skip_synchronize():
                optimizer.step()
        """
        self._hora_should_synchronize = False
        try:
            yield
        finally:
            self._hora_should_synchronize = True
