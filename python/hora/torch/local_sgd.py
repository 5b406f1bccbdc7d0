"""Local SGD / periodic model averaging for ``DistributedOptimizer``:
``hvd.DistributedOptimizer(opt, named_parameters=..., local_steps=H)``.

Each rank steps its own optimizer on its own gradients; no gradient is
reduced. After every ``H`` steps the ranks average their parameters (one
grouped allreduce of all of them), so they hold identical parameters again.
That sends the model's bytes once per ``H`` steps instead of the gradients'
every step.

With ``outer_optimizer`` (DiLoCo, Douillard et al. 2023) the averaged
parameters are not taken as they are: the parameters at the last
averaging (the "anchor") minus the new average is a pseudo-gradient, which
an outer optimizer made by ``outer_optimizer(anchor_tensors)`` applies to
the anchor, for instance ``lambda ps: torch.optim.SGD(ps, lr=0.7,
momentum=0.9, nesterov=True)``. Every rank then starts the next ``H``
steps from the new anchor.

The anchor is taken at the first ``step()``, so broadcast the parameters
(``hvd.broadcast_parameters``) before training, as always. In an elastic
job the count and the anchor start again when the world changes.
"""

from __future__ import annotations

import contextlib

import torch

from hora.common.basics import Average


class _LocalSGDOptimizer:
    """Mixin in front of the user's optimizer class (see ``_rewrap``)."""

    def _hora_local_setup(self, params, local_steps, outer_factory, process_set, member):
        self._hora_local_params = list(params)
        self.local_steps = local_steps
        self._hora_outer_factory = outer_factory
        self._hora_process_set = process_set
        self._hora_member = member
        self._hora_local_reset()

    def _hora_local_reset(self) -> None:
        """Starts counting again from the parameters as they are at the
        next step (a new world, or construction)."""
        self._hora_local_count = 0
        self._hora_anchor = None
        self._hora_outer = None

    def _hora_take_anchor(self):
        with torch.no_grad():
            self._hora_anchor = [p.detach().clone() for p in self._hora_local_params]
        if self._hora_outer_factory is not None:
            self._hora_outer = self._hora_outer_factory(self._hora_anchor)
            if not isinstance(self._hora_outer, torch.optim.Optimizer):
                raise TypeError(f"DistributedOptimizer: outer_optimizer must return a "
                                f"torch.optim.Optimizer over the tensors it is given, got "
                                f"{type(self._hora_outer).__name__}")

    def step(self, closure=None):
        """The local optimizer's step; after every ``local_steps`` of them,
        the parameters are averaged over the ranks (and, with an outer
        optimizer, applied to the anchor through it)."""
        if not self._hora_member:
            return super().step(closure)
        if self._hora_anchor is None:
            self._hora_take_anchor()
        loss = super().step(closure)
        self._hora_local_count += 1
        if self._hora_local_count % self.local_steps == 0:
            self._hora_average()
        return loss

    def add_param_group(self, param_group):
        """The wrapped optimizer's ``add_param_group``; the new parameters
        are averaged too (every rank must add the same groups in the same
        order). With an outer optimizer, the anchor is taken again, and the
        outer optimizer made anew, at the next step."""
        super().add_param_group(param_group)
        if "_hora_local_params" not in self.__dict__:
            return
        known = {id(p) for p in self._hora_local_params}
        added = [p for p in self.param_groups[-1]["params"]
                 if p.requires_grad and id(p) not in known]
        self._hora_local_params.extend(added)
        if added and self._hora_outer_factory is not None:
            self._hora_anchor = None
            self._hora_outer = None

    def _hora_own_step(self, closure=None):
        """The wrapped optimizer's own step, uncounted: what
        ``broadcast_optimizer_state`` runs on ranks without state to make
        it (only some ranks run it, so it must not count towards, or
        start, an averaging)."""
        return super().step(closure)

    def _hora_average(self):
        from hora.torch import mpi_ops
        params = [p.detach() for p in self._hora_local_params]
        with torch.no_grad():
            # the parameters become their average, in place
            mpi_ops.grouped_allreduce_(params, name="local_sgd.parameters", op=Average,
                                       process_set=self._hora_process_set)
            if self._hora_outer is None:
                return
            for anchor, mean in zip(self._hora_anchor, params):
                anchor.grad = anchor - mean
        self._hora_outer.step()
        with torch.no_grad():
            for p, anchor in zip(params, self._hora_anchor):
                p.copy_(anchor)
                anchor.grad = None

    def synchronize(self):
        """Nothing to wait for: local SGD reduces no gradients."""

    def skip_synchronize(self):
        """A context in which ``step()`` behaves as always (there is no
        gradient reduction to skip)."""
        return contextlib.nullcontext()
