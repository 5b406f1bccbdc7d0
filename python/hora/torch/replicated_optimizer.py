"""The replicated DistributedOptimizer's class: the mixin put in front of
the wrapped optimizer's class by :func:`hora.torch.DistributedOptimizer`
(see :mod:`hora.torch.optimizer` for what it does, and the factory that
builds its units and buckets).

A hook on each parameter notes when autograd has accumulated its gradient;
when a unit (a bucket, a group or one gradient) is complete its reduction
starts: a bucket as one flat submission whose gradients become views of
the bucket's buffer, a stateful compressor's unit through the compressor's
two collectives, any other unit as one (grouped) allreduce. ``synchronize()``
starts what is left, waits for all of it and writes the results.
"""

from __future__ import annotations

from typing import Any

import torch

from hora.common._adapter.handles import DoneHandle, wait_all
from hora.common.basics import elastic_job, is_initialized, size
from hora.common.exceptions import HoraError
from hora.common.gradient_policy import GradientPolicy, check_backward_passes
from hora.torch import mpi_ops
from hora.torch._collectives import (
    bucket_packable, global_process_set, set_id, set_size, start_bucket)
from hora.torch._optimizer_common import SynchronizeSwitch, gradient_ready_hook
from hora.torch._optimizer_errors import (
    too_many_passes, warn_step_after_synchronize, zero_grad_while_reducing)
from hora.torch.compression import Compression

_UNNAMED = "allreduce.noname"
_BUCKET_PREFIX = "allreduce.bucket."


class _DistributedOptimizer(SynchronizeSwitch):
    """Mixed in before the wrapped optimizer's class; never instantiated on
    its own. All of its state lives in attributes starting with ``_hora_``."""

    # --- set-up ------------------------------------------------------------

    def _hora_setup(self, names, units, unit_names, buckets, policy: GradientPolicy,
                    backward_passes_per_step, sparse_as_dense, process_set):
        self._hora_compression = policy.compression
        # passed to every reduction: the global set costs one identity check
        self._hora_process_set = process_set
        # outside the set nothing is reduced: no hooks, step() is a local one;
        # nor in a job of one rank (that is not elastic), as in Horovod: the
        # optimizer is then the wrapped one (gradients never produced stay
        # None, passes accumulate, zero_grad may come at any time)
        # (wrapped before hora.init(), the size is not known yet: hooked)
        self._hora_member = ((process_set is global_process_set or bool(process_set.included()))
                             and (not is_initialized() or size() > 1 or elastic_job()))
        self.backward_passes_per_step = backward_passes_per_step
        self._hora_op = policy.op
        self._hora_prescale = policy.prescale
        self._hora_postscale = policy.postscale
        self._hora_sparse_as_dense = bool(sparse_as_dense)
        self._hora_names = {}       # parameter -> collective name
        self._hora_units: list[list[Any]] = []  # lists of parameters reduced together
        self._hora_unit_names: list[str | None] = []  # None: no name of its own
        self._hora_buckets = set()  # indices of units made by bucketing, not by groups=
        self._hora_unit_of: dict[Any, int] = {}  # parameter -> index into _hora_units
        # parameter -> backward passes left before reducing
        self._hora_delay: dict[Any, int] = {}
        # unit index -> parameters whose passes are done
        self._hora_ready: dict[int, set[Any]] = {}
        # unit index -> reduction in flight (None: not started)
        self._hora_pending: dict[int, Any] = {}
        # bucket index -> (flat buffer, its views shaped as the gradients)
        self._hora_flat: dict[int, Any] = {}
        self._hora_hooks: list[Any] = []
        self._hora_synchronized = False
        self._hora_should_synchronize = True
        self._hora_clipped = False  # clip_grad_norm_ reduced for the coming step()
        self._hora_names.update(names)
        for unit, unit_name in zip(units, unit_names):
            if buckets:
                self._hora_buckets.add(len(self._hora_units))
            self._hora_add_unit(unit, unit_name)

    def _hora_add_unit(self, params, unit_name):
        index = len(self._hora_units)
        self._hora_units.append(list(params))
        self._hora_unit_names.append(unit_name)
        hook = gradient_ready_hook(self)
        for p in params:
            self._hora_unit_of[p] = index
            self._hora_delay[p] = self.backward_passes_per_step
            if self._hora_member:
                self._hora_hooks.append(p.register_post_accumulate_grad_hook(hook))

    # --- hooks and reductions -------------------------------------------------

    def _hora_on_grad(self, p):
        index = self._hora_unit_of.get(p)
        if index is None:
            return
        if self._hora_delay[p] <= 0:
            raise too_many_passes(self._hora_names[p], self.backward_passes_per_step)
        self._hora_delay[p] -= 1
        self._hora_pending.setdefault(index, None)
        if self._hora_delay[p] == 0:
            ready = self._hora_ready.setdefault(index, set())
            ready.add(p)
            if len(ready) == len(self._hora_units[index]):
                self._hora_start(index)

    def _hora_start(self, index):
        params = self._hora_units[index]
        bucket = index in self._hora_buckets
        entries = []
        for p in params:
            if p.grad is None:
                # never produced on this rank (an unused parameter): other
                # ranks may have it, so contribute zeros rather than hang
                p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
        if bucket and not self._hora_sparse_as_dense:
            # a bucket is hora's packing, not the user's groups: a sparse
            # gradient in it is reduced on its own, as Horovod would
            for p in [p for p in params if p.grad.is_sparse]:
                entries.append(self._hora_start_one(index, [p], False))
            params = [p for p in params if not p.grad.is_sparse]
        if params:
            grouped = len(params) > 1 or (self._hora_unit_names[index] is not None and not bucket)
            entries.append(self._hora_start_one(index, params, grouped))
        self._hora_pending[index] = entries

    def _hora_start_one(self, index, params, grouped):
        """Starts the reduction of ``params``' gradients: one grouped
        allreduce, or one (sparse or dense) allreduce of a single gradient
        under the parameter's name."""
        was_sparse = set()
        for p in params:
            if p.grad.is_sparse and (self._hora_sparse_as_dense or grouped):
                # reduced dense, handed back sparse (as Horovod does) for
                # optimizers that need sparse gradients, e.g. SparseAdam
                was_sparse.add(p)
                p.grad = p.grad.to_dense()
        if not grouped and params[0].grad.is_sparse:
            p = params[0]
            handle = mpi_ops.sparse_allreduce_async(p.grad, name=self._hora_names[p],
                                                    op=self._hora_op,
                                                    process_set=self._hora_process_set)
            return ("sparse", handle, [p], (), None)
        if (grouped and index in self._hora_buckets
                and self._hora_compression is Compression.none
                and bucket_packable(params[0].grad, self._hora_op)):
            flat, views = self._hora_bucket_views(index, params)
            handle = start_bucket(
                flat, views, [p.grad for p in params], f"{self._hora_unit_names[index]}.0",
                self._hora_op, self._hora_prescale, self._hora_postscale,
                set_id(self._hora_process_set, "DistributedOptimizer"))
            return ("bucket", handle, list(zip(params, views)), was_sparse,
                    self._hora_unit_names[index])
        if getattr(self._hora_compression, "stateful", False):
            # PowerSGD: two allreduces, the second started in synchronize()
            name = self._hora_unit_names[index] if grouped else self._hora_names[params[0]]
            compression = self._hora_compression
            round_ = compression.start([(self._hora_names[p], p.grad) for p in params],
                                       self._hora_op)
            if not round_.first:  # nothing compressed or sent in the first collective
                handle = DoneHandle([])
            elif compression.first_collective == "allgather":
                handle = mpi_ops.grouped_allgather_async(
                    round_.first, name=f"{name}.compressed.first",
                    process_set=self._hora_process_set)
            else:
                handle = mpi_ops.grouped_allreduce_async_(
                    round_.first, name=f"{name}.compressed.first", op=round_.first_op,
                    process_set=self._hora_process_set)
            return ("compressed", handle, (round_, name), was_sparse, None)
        compressed = [self._hora_compression.compress(p.grad) for p in params]
        tensors = [c for c, _ in compressed]
        if grouped:
            handle = mpi_ops.grouped_allreduce_async_(
                tensors, name=self._hora_unit_names[index], op=self._hora_op,
                prescale_factor=self._hora_prescale, postscale_factor=self._hora_postscale,
                process_set=self._hora_process_set)
        else:
            handle = mpi_ops.allreduce_async_(
                tensors[0], name=self._hora_names[params[0]], op=self._hora_op,
                prescale_factor=self._hora_prescale, postscale_factor=self._hora_postscale,
                process_set=self._hora_process_set)
        group = self._hora_unit_names[index] if grouped else None
        return ("dense", handle, list(zip(params, compressed)), was_sparse, group)

    def _hora_compressed_second(self, rounds):
        """A stateful compressor's second allreduce of every unit (PowerSGD's
        ``Q`` matrices, the one-bit compressor's small gradients), all
        started before any is waited for, then the gradients."""
        compression = self._hora_compression
        seconds = []
        for (round_, name), gathered in rounds:
            tensors = compression.second(round_, gathered)
            seconds.append(mpi_ops.grouped_allreduce_async_(
                tensors, name=f"{name}.compressed.second", op=round_.second_op,
                process_set=self._hora_process_set) if tensors else None)
        wait_all([h for h in seconds if h is not None])
        ranks = set_size(self._hora_process_set)
        for (round_, _), _ in rounds:
            compression.finish(round_, ranks)
        compression.end_step()

    def _hora_bucket_views(self, index, params):
        """The flat buffer of bucket ``index`` and its views, shaped as the
        gradients: after each reduction the gradients are these views (as
        with DDP's ``gradient_as_bucket_view``), so a bucket whose
        gradients were accumulated into them (``set_to_none=False``) is
        reduced in place as one tensor."""
        first = params[0].grad
        flat, views = self._hora_flat.get(index, (None, None))
        if flat is None or flat.dtype != first.dtype or flat.device != first.device:
            flat = torch.zeros(sum(p.numel() for p in params), dtype=first.dtype,
                               device=first.device)
            with torch.no_grad():
                views = torch._C._nn.unflatten_dense_tensors(flat, [p.grad for p in params])
            self._hora_flat[index] = (flat, views)
        return flat, views

    def _hora_name_group_member(self, error, entries):
        """``error`` with the parameter named where it names a member of a
        grouped submission (``'<group name>.<position>'``): a bucket's
        members were never named by the user."""
        message = str(error)
        for _, _, members, _, group in entries:
            if group is None or f"'{group}." not in message:
                continue
            position = message.split(f"'{group}.", 1)[1].split("'", 1)[0]
            if message.startswith("Mismatched shape of member "):
                # a packed submission names the member by its place in
                # the group
                position = message[len("Mismatched shape of member "):].split(" ", 1)[0]
            if position.isdigit() and int(position) < len(members):
                parameter = self._parameter_names.get(members[int(position)][0], "?")
                hint = ("; bucket_bytes=0 reduces each on its own"
                        if group.startswith(_BUCKET_PREFIX) else "")
                return type(error)(f"{message} (the gradient of parameter '{parameter}', one of "
                                   f"{len(members)} reduced together{hint})")
        return error

    def _hora_finish(self, entry, result):
        kind, _, members, was_sparse, _ = entry
        with torch.no_grad():
            if kind == "sparse":
                members[0].grad = result
                return
            if kind == "compressed":
                for p in was_sparse:
                    p.grad = p.grad.to_sparse()
                return
            if kind == "bucket":
                for p, view in members:
                    if p.grad is not view:
                        p.grad = view
                    if p in was_sparse:
                        p.grad = p.grad.to_sparse()
                return
            for p, (tensor, ctx) in members:
                if tensor is not p.grad:
                    p.grad.copy_(self._hora_compression.decompress(tensor, ctx))
                if p in was_sparse:
                    p.grad = p.grad.to_sparse()

    # --- public API -----------------------------------------------------------

    def set_backward_passes_per_step(self, passes):
        """Changes how many backward passes are accumulated locally before the
        gradients are reduced (an int >= 1, else ``ValueError``). Call it
        between steps."""
        self.backward_passes_per_step = check_backward_passes(
            passes, "DistributedOptimizer.set_backward_passes_per_step")
        for p in self._hora_delay:
            self._hora_delay[p] = self.backward_passes_per_step

    def synchronize(self):
        """Completes the reduction of every gradient: starts those not started
        yet (parameters whose gradient this rank never produced contribute
        zeros, so no rank waits forever), waits for all and writes the
        results into ``p.grad``. Call it before inspecting or clipping
        gradients, then call ``step()`` inside :meth:`skip_synchronize`.
        On a rank outside the optimizer's process set it does nothing (the
        gradients stay this rank's own). Raises the collective's
        :class:`hora.HoraError` if one failed."""
        if not self._hora_member:
            self._hora_synchronized = True
            return
        for index in range(len(self._hora_units)):
            if self._hora_pending.get(index) is None:
                self._hora_start(index)
        entries = [entry for index in range(len(self._hora_units))
                   for entry in self._hora_pending[index]]
        try:
            results = wait_all([entry[1] for entry in entries])
        except HoraError as error:
            raise self._hora_name_group_member(error, entries) from None
        finally:
            self._hora_restart_passes()
        rounds = [(entry[2], result) for entry, result in zip(entries, results)
                  if entry[0] == "compressed"]
        if rounds:
            self._hora_compressed_second(rounds)
        for entry, result in zip(entries, results):
            self._hora_finish(entry, result)
        self._hora_synchronized = True

    def _hora_restart_passes(self):
        """No reduction pending, and every parameter's backward passes
        counted from zero."""
        self._hora_pending.clear()
        self._hora_ready.clear()
        for p in self._hora_delay:
            self._hora_delay[p] = self.backward_passes_per_step

    def _hora_drop_step(self):
        """Forgets the step in flight (its reductions failed with a lost
        rank) and its gradients, so that the survivors redo it in a world
        re-formed in place (hora.common.elastic)."""
        self._hora_restart_passes()
        self._hora_synchronized = self._hora_clipped = False
        super().zero_grad(set_to_none=True)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the averaged gradients:
        reduces them first if :meth:`synchronize` has not run, then clips
        every parameter's gradient by their total norm, which it returns
        (the same on every rank). Call it between ``backward()`` and
        ``step()``; ``step()`` then does not reduce again. The sharded
        optimizer has the same method, so a script clips the same way
        whatever its ``sharding``."""
        if not self._hora_synchronized:
            self.synchronize()
        self._hora_clipped = True
        params = [p for group in self.param_groups for p in group["params"]]
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type,
                                              error_if_nonfinite=error_if_nonfinite)

    def step(self, closure=None):
        """Waits for the gradients' reductions (see :meth:`synchronize`), then
        runs the wrapped optimizer's ``step(closure)`` and returns its result.
        If :meth:`synchronize` was already called and no gradient was
        produced since, warns and does not reduce again."""
        if self._hora_should_synchronize and not self._hora_clipped:
            if self._hora_synchronized and not self._hora_pending:
                warn_step_after_synchronize()
            else:
                self.synchronize()
        self._hora_synchronized = self._hora_clipped = False
        return super().step(closure)

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's ``zero_grad``. Raises ``RuntimeError`` when
        called after ``loss.backward()`` but before ``step()`` /
        ``synchronize()``: the gradients are then being reduced in place."""
        if self._hora_pending:
            raise zero_grad_while_reducing()
        return super().zero_grad(*args, **kwargs)

    def load_state_dict(self, state_dict):
        """The wrapped optimizer's ``load_state_dict``, after forgetting the
        step in progress, as Horovod does: reductions already started are
        waited for and their results dropped, and every parameter's
        backward passes count from zero again (reloading a checkpoint after
        a bad step, say)."""
        if "_hora_units" in self.__dict__:
            started = [entry[1] for entries in self._hora_pending.values() if entries
                       for entry in entries]
            try:
                wait_all(started)
            except HoraError:
                pass  # dropped anyway
            self._hora_restart_passes()
            self._hora_synchronized = self._hora_clipped = False
            self._hora_should_synchronize = True
        return super().load_state_dict(state_dict)

    def add_param_group(self, param_group):
        """The wrapped optimizer's ``add_param_group``; the new parameters'
        gradients are reduced too, under names derived from their position
        (so every rank must add the same groups in the same order)."""
        super().add_param_group(param_group)
        if "_hora_units" not in self.__dict__:
            return
        group_index = len(self.param_groups) - 1
        for j, p in enumerate(self.param_groups[-1]["params"]):
            if p in self._hora_unit_of or not p.requires_grad:
                continue
            self._parameter_names[p] = f"{_UNNAMED}.{group_index}.{j}"
            self._hora_names[p] = f"allreduce.{self._parameter_names[p]}"
            self._hora_add_unit([p], None)


# torch wraps an optimizer class's step() for its profiler and step hooks;
# the wrapped class's own step() already is, so ours must not run them twice.
_DistributedOptimizer.step.hooked = True  # type: ignore[attr-defined]
