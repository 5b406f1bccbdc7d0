"""The gradient hook every torch DistributedOptimizer flavour registers."""

from __future__ import annotations

import weakref
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
