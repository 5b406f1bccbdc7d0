"""DistributedOptimizer(op=Adasum): Horovod's delta optimizer.

With Adasum the reduction is not applied to gradients but to the step each
rank's optimizer would take on its own. As soon as autograd has produced a
parameter's gradient, the wrapped optimizer steps that one parameter
locally; the change it made (the *delta*) is combined over the ranks with
Adasum while the backward pass goes on, and ``step()`` sets every
parameter to its value before the local step plus the combined delta.
Optimizer state (momentum, Adam's moments) therefore stays each rank's own,
as in Horovod.

On GPU tensors the delta travels through host memory (there is no GPU
implementation of Adasum in hora; hora.torch says so once with a warning).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch

from hora.common.basics import Adasum
from hora.common.exceptions import HoraUsageError
from hora.torch import mpi_ops


class _DistributedAdasumOptimizer:
    """Mixed in before the wrapped optimizer's class; all of its state lives
    in attributes starting with ``_hora_``."""

    def _hora_adasum_setup(self, base, names, compression, backward_passes_per_step,
                           process_set):
        self._hora_base = base
        self._hora_names = dict(names)  # parameter -> collective name
        self._hora_compression = compression
        self._hora_process_set = process_set
        self.backward_passes_per_step = backward_passes_per_step
        self._hora_delay = {p: backward_passes_per_step for p in self._hora_names}
        self._hora_handles = {}  # parameter -> (handle, ctx, reduced tensor) or None
        self._hora_start = {}    # parameter -> its value before the local step
        self._hora_requires = []
        self._hora_hooks = []
        this = weakref.ref(self)

        def hook(param):
            optimizer = this()
            if optimizer is not None:
                optimizer._hora_on_grad(param)

        for group in self.param_groups:
            for p in group["params"]:
                if not p.requires_grad:
                    continue
                self._hora_start[p] = torch.zeros_like(p, requires_grad=False)
                self._hora_requires.append(p)
                self._hora_hooks.append(p.register_post_accumulate_grad_hook(hook))

    def _hora_on_grad(self, p):
        if p not in self._hora_delay:
            return
        if self._hora_handles.get(p) is not None and self._hora_delay[p] <= 0:
            raise HoraUsageError(
                f"the gradient of '{self._hora_names[p]}' was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before "
                f"optimizer.step(); raise backward_passes_per_step to accumulate more passes "
                f"locally")
        self._hora_delay[p] -= 1
        self._hora_handles[p] = self._hora_reduce_delta(p) if self._hora_delay[p] == 0 else None

    def _hora_reduce_delta(self, p):
        """Steps the wrapped optimizer on ``p`` alone, turns ``p`` into the
        delta that step made, and starts its Adasum reduction."""
        start = self._hora_start[p]
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        stashed = [group["params"] for group in self.param_groups]
        for group in self.param_groups:
            group["params"] = [p] if any(p is q for q in group["params"]) else []
        try:
            with torch.no_grad():
                start.copy_(p)
            self._hora_base.step(self)
            with torch.no_grad():
                p.sub_(start)
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        tensor, ctx = self._hora_compression.compress(p.detach())
        handle = mpi_ops.allreduce_async_(tensor, name=self._hora_names[p], op=Adasum,
                                          process_set=self._hora_process_set)
        return handle, ctx, tensor

    def synchronize(self):
        """Nothing to do: ``step()`` waits for the deltas (as in Horovod)."""

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Not available with Adasum, as in Horovod."""
        raise HoraUsageError("skip_synchronize() is not supported with op=Adasum: step() "
                             "applies the combined deltas itself")
        yield  # pragma: no cover - a generator for contextmanager

    def set_backward_passes_per_step(self, passes):
        """Changes how many backward passes run before a parameter's delta
        is reduced."""
        self.backward_passes_per_step = passes
        for p in self._hora_delay:
            self._hora_delay[p] = passes

    def step(self, closure=None):
        """Reduces the deltas of parameters whose gradients have not yet
        started (synchronously, as Horovod does), waits for all of them and
        sets every parameter to its starting value plus the combined delta."""
        loss = closure() if closure is not None else None
        for p in self._hora_requires:
            if self._hora_handles.get(p) is None:
                self._hora_handles[p] = self._hora_reduce_delta(p)
        for p, (handle, ctx, _) in list(self._hora_handles.items()):
            reduced = mpi_ops.synchronize(handle)
            delta = self._hora_compression.decompress(reduced, ctx)
            with torch.no_grad():
                start = self._hora_start[p]
                start.add_(delta.to(device=start.device, dtype=start.dtype))
                p.copy_(start)
            self._hora_delay[p] = self.backward_passes_per_step
        self._hora_handles.clear()
        return loss

    def zero_grad(self, *args: Any, **kwargs: Any):
        """The wrapped optimizer's ``zero_grad``; refused while deltas are
        being reduced (between ``backward()`` and ``step()``)."""
        if self._hora_handles:
            raise HoraUsageError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step(); this is prohibited with op=Adasum, "
                                 "as the deltas are still being reduced")
        return self._hora_base.zero_grad(self, *args, **kwargs)
