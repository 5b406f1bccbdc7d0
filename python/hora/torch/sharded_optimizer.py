"""The sharded ``DistributedOptimizer`` (ZeRO stages 1, 2 and 3).

``DistributedOptimizer(opt, ..., sharding="optimizer_state" | "gradients" |
"parameters")`` returns an object of a subclass of ``type(opt)`` made with
this mixin. The parameters are packed into the replicated optimizer's ready-order buckets
and each bucket is cut among the ranks (:mod:`hora.common.shard_layout`):

- as backward produces a bucket's gradients, they are copied into one flat
  buffer, and that buffer is reduce-scattered while backward goes on (on
  host memory in place, so each rank's shard of the reduced bucket ends up
  in its part of the buffer);
- ``step()`` runs the wrapped optimizer on this rank's pieces only: 1-D
  views of the parameters (the optimizer's state is therefore 1/N of
  replicated), whose gradients are views of the reduced shards;
- the updated pieces are then allgathered into every rank's parameters
  (on host memory a bucket's parameters are views of one flat buffer, which
  the allgather fills around this rank's part).

Stage 1 (``"optimizer_state"``) leaves autograd's gradients in ``p.grad``
(accumulated locally over ``backward_passes_per_step``, reduced once, as
the replicated optimizer does); stage 2 (``"gradients"``) frees each
``p.grad`` as soon as it is in its bucket and reduces every backward pass
into the shard, so only 1/N of the gradients outlives a bucket. Stage 3
(``"parameters"``) is stage 2 whose pieces are views of shards that the
parameters are gathered from around each block of the model
(:mod:`hora.torch.parameter_sharding`), so nothing is allgathered after
the update.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Any

import torch

from hora._loader import _C
from hora.common._adapter.handles import Handle, poll, synchronize, wait_for
from hora.common.basics import Max, Sum, elastic_job, is_initialized, size
from hora.common.compression import NoneCompressor
from hora.common.exceptions import HoraError
from hora.common.shard_layout import ShardLayout
from hora.torch import _memory
from hora.torch._collectives import (
    global_process_set, set_id, set_rank, set_size,
    start_allgather, start_allgather_into, start_reducescatter, start_reducescatter_in_place)
from hora.torch._optimizer_common import SynchronizeSwitch, gradient_ready_hook
from hora.torch.parameter_sharding import ParameterShards
from hora.torch._optimizer_errors import (
    too_many_passes, warn_step_after_synchronize, zero_grad_while_reducing)

# The largest default bucket with sharding: the buckets in flight during
# backward are what stage 2 holds beyond its shards (4 MiB buckets put a
# 96 M-parameter transformer at 0.435 of replicated memory at 4 ranks, 25
# MiB ones at 0.459; the engine's cost per bucket is tens of microseconds).
SHARDED_BUCKET_BYTES = 4 << 20

# Reductions of a bucket may queue behind one another when the link is
# slower than backward; past this many in flight backward waits for the
# oldest, which bounds the flat buffers alive at once.
_MAX_BUCKETS_IN_FLIGHT = 2
# How long backward waits for the oldest reduction when too many are in
# flight. Ranks whose backward passes skip different blocks launch buckets in
# different orders, and a rank may reach the oldest bucket's reduction only at
# synchronize(); waiting for it without limit would leave every rank waiting
# for another. Past this, more buckets stay in flight (memory, not a hang).
_IN_FLIGHT_PATIENCE = 0.05
# Allgathers of updated buckets in flight at once (a GPU bucket's result is
# a whole bucket until it is copied into the parameters).
_MAX_GATHERS_IN_FLIGHT = 2


class _ShardedOptimizer(SynchronizeSwitch):
    """Mixed in before the wrapped optimizer's class; never instantiated on
    its own. Its state lives in attributes starting with ``_hora_``."""

    # --- set-up ------------------------------------------------------------

    def _hora_shard_setup(self, params, names, units, stage, policy, passes,
                          sparse_as_dense, process_set, replicas=None, model_units=None):
        self._hora_stage = stage
        # hybrid sharding: the ranks holding the same shard in other sets
        self._hora_replicas = replicas
        self._hora_params = params                  # layout position -> parameter
        self._hora_position = {p: i for i, p in enumerate(params)}
        # (stage 3 empties the parameters between uses)
        self._hora_shapes = {p: tuple(p.shape) for p in params}
        self._hora_process_set = process_set
        self._hora_set = set_id(process_set, "DistributedOptimizer")
        self._hora_member = process_set is global_process_set or bool(process_set.included())
        self._hora_units = units
        self._hora_model_units = model_units
        # in a job of one rank (not elastic) nothing is sent, so nothing is
        # cast for the wire (the replicated optimizer reduces nothing there)
        self._hora_compression = (NoneCompressor if is_initialized() and size() == 1
                                  and not elastic_job() else policy.compression)
        self._hora_op = policy.op
        self._hora_prescale = policy.prescale
        self._hora_postscale = policy.postscale
        self._hora_sparse_as_dense = bool(sparse_as_dense)
        self.backward_passes_per_step = passes
        self._hora_bucket_names = []
        for unit in units:
            first, last = names[params[unit[0]]], names[params[unit[-1]]]
            self._hora_bucket_names.append(f"bucket.{first}..{last}.{len(unit)}")
        self._hora_flat_params = {}  # bucket -> the flat buffer its parameters view
        self._hora_shards = None     # stage 3: the parameters' shards, gathers, module hooks
        self._hora_hooks = []
        # a process waiting to join an elastic world in place takes no part
        # in collectives yet: the values come with the world's state
        self._hora_cut(broadcast_root=not _C.joining())
        # per step
        self._hora_delay = {p: passes for p in params}
        self._hora_flat = {}        # bucket -> flat buffer being filled
        self._hora_arrived = {}     # bucket -> parameters copied into it
        self._hora_launches = collections.Counter()  # bucket -> reductions started
        self._hora_filled = set()   # buckets whose shard holds this step's first result
        self._hora_in_flight = collections.deque()
        self._hora_synchronized = False
        self._hora_should_synchronize = True
        self._hora_clipped = False  # clip_grad_norm_ reduced for the coming step()
        self._hora_loaded = None    # a full state dict loaded since the last step

    def _hora_cut(self, broadcast_root):
        """Cuts the buckets among the ranks of the process set as it is now:
        this rank's gradient shards and pieces (and, at stage 3, its
        parameter shards and the module hooks), and the gradient hooks.
        With ``broadcast_root`` the set's first rank's parameter values
        become every rank's (stage 3 does that here; other stages leave it
        to the usual ``broadcast_parameters``)."""
        params = self._hora_params
        size = set_size(self._hora_process_set) if self._hora_member else 1
        self._hora_rank = set_rank(self._hora_process_set) if self._hora_member else 0
        self._hora_layout = ShardLayout([p.numel() for p in params], self._hora_units, size)
        layout = self._hora_layout
        # This rank's shard of each bucket's reduced gradient; the pieces'
        # .grad are views into it.
        self._hora_grad_shards = []
        self._hora_pieces = {}   # parameter -> _hora_make_piece(its piece)
        if self._hora_member and self._hora_stage == 3:
            model, unit_buckets, modules = self._hora_model_units
            self._hora_shards = ParameterShards(self, model, unit_buckets, modules)
            self._hora_shards.shard(broadcast_root=broadcast_root)
        elif self._hora_member and not self._hora_flat_params:
            # (outside the set every step is a local one)
            for b in range(len(layout.buckets)):
                self._hora_flatten(b)
        if self._hora_member:
            for b, bucket in enumerate(layout.buckets):
                head = params[bucket.members[0]]
                self._hora_grad_shards.append(torch.zeros(
                    layout.shard_numel(b, self._hora_rank), dtype=head.dtype,
                    device=head.device))
            for piece in layout.pieces(self._hora_rank):
                self._hora_pieces[params[piece.param]] = self._hora_make_piece(piece)
            hook = gradient_ready_hook(self)
            for p in params:
                self._hora_hooks.append(p.register_post_accumulate_grad_hook(hook))

    def _hora_recut(self):
        """After the world changed in place (hora.common.elastic): the
        buckets cut again for the set's ranks as they are now. Local. The
        optimizer state is forgotten, and at stage 3 the parameters are
        whole (zeros) until the caller loads the state, which every rank
        then holds alike: load a full state dict, and the model's weights
        inside :meth:`gathered_parameters`."""
        for handle in self._hora_hooks:
            handle.remove()
        self._hora_hooks = []
        if self._hora_shards is not None:
            self._hora_shards.detach()
            self._hora_shards = None
        self._hora_drop_step()
        self._hora_loaded = None
        self.state = collections.defaultdict(dict)
        self._hora_cut(broadcast_root=False)

    def _hora_drop_step(self):
        """Forgets the step in flight (its reductions failed with a lost
        rank); the state is then cut again and loaded from the last commit
        (hora.common.elastic)."""
        self._hora_reset_step()
        self._hora_synchronized = self._hora_clipped = False
        for p in self._hora_params:
            p.grad = None

    def _hora_flatten(self, b):
        """Makes the parameters of bucket ``b`` views of one flat host buffer,
        so that the updated pieces are allgathered straight into the
        parameters. Buckets on a GPU, or with a parameter that is not
        contiguous (channels_last), keep their parameters as they are."""
        bucket = self._hora_layout.buckets[b]
        members = [self._hora_params[position] for position in bucket.members]
        if not all(p.is_cpu and p.is_contiguous() for p in members):
            self._hora_flat_params.pop(b, None)
            return
        flat = _memory.empty(bucket.numel, members[0].dtype, members[0].device)
        with torch.no_grad():
            for p, offset in zip(members, bucket.offsets):
                view = flat[offset:offset + p.numel()].view(p.shape)
                view.copy_(p)
                p.data = view
        self._hora_flat_params[b] = flat

    def _hora_check_flat(self):
        """(Stages 1 and 2.) Flattens again a bucket whose parameters no longer view its
        buffer (``p.data = ...``, ``load_state_dict(assign=True)``)."""
        for b, flat in list(self._hora_flat_params.items()):
            bucket = self._hora_layout.buckets[b]
            base, size = flat.data_ptr(), flat.element_size()
            if any(self._hora_params[position].data_ptr() != base + offset * size
                   for position, offset in zip(bucket.members, bucket.offsets)):
                self._hora_flatten(b)

    def _hora_make_piece(self, piece):
        """(layout piece, the tensor the wrapped optimizer steps, the
        parameter's address it was made from, whether it is a view)."""
        p = self._hora_params[piece.param]
        view = p.is_contiguous()
        if self._hora_shards is not None:  # stage 3: a view of the bucket's shard
            tensor = self._hora_shards.shards[piece.bucket][piece.offset:
                                                            piece.offset + piece.numel]
        elif view:
            tensor = p.detach().view(-1)[piece.start:piece.stop]
        else:  # a copy, refreshed from the parameter before every step
            tensor = p.detach().reshape(-1)[piece.start:piece.stop].clone()
        tensor.grad = self._hora_grad_shards[piece.bucket][piece.offset:piece.offset + piece.numel]
        return piece, tensor, p.data_ptr(), view

    def _hora_refresh_pieces(self):
        """Makes every piece match its parameter before a step: views are
        re-made where the parameter's memory moved (``p.data = ...``,
        ``model.to(...)``), copies refreshed; the state moves along."""
        for p, (piece, tensor, pointer, view) in list(self._hora_pieces.items()):
            same = p.data_ptr() == pointer
            if same and view and p.is_contiguous():
                continue
            if same and not view and not p.is_contiguous():
                with torch.no_grad():
                    tensor.copy_(p.detach().reshape(-1)[piece.start:piece.stop])
                continue
            fresh = self._hora_make_piece(piece)
            if tensor in self.state:
                self.state[fresh[1]] = self.state.pop(tensor)
            self._hora_pieces[p] = fresh

    # --- hooks and reductions -------------------------------------------------

    def _hora_on_grad(self, p):
        if p not in self._hora_position:
            return
        if self._hora_delay[p] <= 0:
            raise too_many_passes(self._parameter_names.get(p, "?"),
                                  self.backward_passes_per_step)
        self._hora_delay[p] -= 1
        if self._hora_stage >= 2 or self._hora_delay[p] == 0:
            self._hora_take(p)

    def _hora_take(self, p):
        """Copies ``p.grad`` into its bucket's flat buffer (stage 2 then
        frees it) and starts the bucket's reduction once it is complete."""
        position = self._hora_position[p]
        b = self._hora_layout.bucket_of[position]
        arrived = self._hora_arrived.get(b)
        if arrived is not None and p in arrived:
            # a new backward pass reached a bucket before the last pass had
            # filled it (a parameter unused in that pass): that pass's
            # bucket goes now, with zeros for what it lacks
            self._hora_launch(b)
        grad = p.grad
        if (self._hora_stage >= 2 and len(self._hora_layout.buckets[b].members) == 1
                and grad is not None and not grad.is_sparse and grad.is_contiguous()
                and grad.dtype == p.dtype):
            # A bucket of one gradient (a large embedding, an output layer)
            # is reduced in that gradient's own memory, which stage 2 frees
            # anyway: no flat copy of it exists next to it.
            self._hora_flat[b] = grad.detach().view(-1)
        else:
            self._hora_copy_in(self._hora_flat_of(b), position, grad)
        self._hora_arrived.setdefault(b, set()).add(p)
        if self._hora_stage >= 2:
            p.grad = None
        if len(self._hora_arrived[b]) == len(self._hora_layout.buckets[b].members):
            self._hora_launch(b)
            if self._hora_shards is not None:
                # backward is done with this bucket's parameters
                self._hora_shards.free(b)

    def _hora_flat_of(self, b):
        flat = self._hora_flat.get(b)
        if flat is None:
            head = self._hora_params[self._hora_layout.buckets[b].members[0]]
            flat = _memory.empty(self._hora_layout.buckets[b].numel, head.dtype, head.device)
            self._hora_flat[b] = flat
        return flat

    def _hora_copy_in(self, flat, position, grad):
        offset = self._hora_layout.offset_of[position]
        target = flat[offset:offset + self._hora_layout.numels[position]]
        with torch.no_grad():
            if grad is None:
                target.zero_()
                return
            if grad.is_sparse:
                if not self._hora_sparse_as_dense:
                    raise ValueError(
                        f"DistributedOptimizer: the gradient of "
                        f"'{self._parameter_names.get(self._hora_params[position], '?')}' is "
                        f"sparse; sharding reduces flat dense buckets, so pass "
                        f"sparse_as_dense=True (or make the embedding dense)")
                grad = grad.to_dense()
            target.copy_(grad.reshape(-1))

    def _hora_launch(self, b):
        """Starts the reducescatter of bucket ``b``'s flat buffer (members
        that never arrived contribute zeros)."""
        flat = self._hora_flat_of(b)
        arrived = self._hora_arrived.pop(b, set())
        bucket = self._hora_layout.buckets[b]
        for position in bucket.members:
            if self._hora_params[position] not in arrived:
                self._hora_copy_in(flat, position, None)
        del self._hora_flat[b]
        wire, context = self._hora_compression.compress(flat)
        name = f"reducescatter.{self._hora_bucket_names[b]}"
        if self._hora_stage >= 2:
            name = f"{name}.pass{self._hora_launches[b]}"
        self._hora_launches[b] += 1
        if wire.is_cpu and wire.is_contiguous():
            # reduced where it lies: this rank's block of the buffer
            works = start_reducescatter_in_place(wire, name, self._hora_op, self._hora_prescale,
                                                 self._hora_postscale, process_set=self._hora_set)
            start, stop = self._hora_layout.bounds(b, self._hora_rank)
            handle = Handle(works, lambda ws, wire=wire: wire[start:stop])
        else:
            works, finish = start_reducescatter([wire], [name], self._hora_op,
                                                self._hora_prescale, self._hora_postscale,
                                                process_set=self._hora_set)
            handle = Handle(works, lambda ws: finish(ws)[0])
        self._hora_in_flight.append((b, handle, wire, context))
        while self._hora_in_flight:
            oldest = self._hora_in_flight[0][1]
            if not (poll(oldest) or (len(self._hora_in_flight) > _MAX_BUCKETS_IN_FLIGHT
                                     and wait_for(oldest, _IN_FLIGHT_PATIENCE))):
                break
            self._hora_finish_oldest()

    def _hora_finish_oldest(self):
        b, handle, _, context = self._hora_in_flight.popleft()
        try:
            shard = synchronize(handle)
        except HoraError as error:
            self._hora_abandon()
            raise self._hora_name_bucket(error, b) from None
        shard = self._hora_compression.decompress(shard, context)
        with torch.no_grad():
            if b in self._hora_filled:
                self._hora_grad_shards[b].add_(shard)
            else:
                self._hora_grad_shards[b].copy_(shard)
                self._hora_filled.add(b)

    def _hora_abandon(self):
        """After a failed reduction: waits for the others (the engine may
        still write into their buffers) and forgets the step's progress."""
        for _, handle, _, _ in self._hora_in_flight:
            with contextlib.suppress(HoraError):
                synchronize(handle)
        self._hora_reset_step()

    def _hora_reset_step(self):
        self._hora_in_flight.clear()
        self._hora_flat.clear()
        self._hora_arrived.clear()
        self._hora_launches.clear()
        self._hora_filled.clear()
        for p in self._hora_delay:
            self._hora_delay[p] = self.backward_passes_per_step

    def _hora_name_bucket(self, error, b, what="gradients"):
        bucket = self._hora_layout.buckets[b]
        first = self._parameter_names.get(self._hora_params[bucket.members[0]], "?")
        last = self._parameter_names.get(self._hora_params[bucket.members[-1]], "?")
        verb = "reduced" if what == "gradients" else "gathered"
        return type(error)(f"{error} (the {what} of the {len(bucket.members)} parameter(s) "
                           f"'{first}' .. '{last}', {verb} together as one sharded bucket)")

    def _hora_reduce_across_replicas(self):
        """Hybrid sharding: averages (or sums) each reduced shard over the
        ranks that hold the same shard in the other sets, as one grouped
        allreduce."""
        from hora.torch.mpi_ops import grouped_allreduce_
        shards = [s for s in self._hora_grad_shards if s.numel()]
        if not shards:
            return
        compressed = [self._hora_compression.compress(s) for s in shards]
        wires = [wire for wire, _ in compressed]
        try:
            grouped_allreduce_(wires, op=self._hora_op,
                               name="DistributedOptimizer.sharding.replicas",
                               process_set=self._hora_replicas)
        except HoraError as error:
            raise type(error)(f"{error} (the reduction of this rank's gradient shards across "
                              f"the replicas of its process set)") from None
        with torch.no_grad():
            for shard, wire, (_, context) in zip(shards, wires, compressed):
                if wire is not shard:
                    shard.copy_(self._hora_compression.decompress(wire, context))

    def _hora_pending(self):
        return bool(self._hora_in_flight or self._hora_flat or self._hora_launches)

    # --- public API -----------------------------------------------------------

    def set_backward_passes_per_step(self, passes):
        """As on the replicated optimizer: an int >= 1, between steps."""
        from hora.common.gradient_policy import check_backward_passes
        self.backward_passes_per_step = check_backward_passes(
            passes, "DistributedOptimizer.set_backward_passes_per_step")
        for p in self._hora_delay:
            self._hora_delay[p] = self.backward_passes_per_step

    def synchronize(self):
        """Completes the reduction of every bucket: starts those not started
        (gradients this rank never produced count as zeros, so no rank
        waits forever) and waits until this rank's shard of every reduced
        gradient is in place. Afterwards ``p.grad`` is not the averaged
        gradient (stage 1 leaves the local one, stage 2 none): the reduced
        shards are what :meth:`clip_grad_norm_` and ``step()`` use. On a
        rank outside the optimizer's process set it does nothing."""
        if not self._hora_member:
            self._hora_synchronized = True
            return
        try:
            for b in range(len(self._hora_layout.buckets)):
                if self._hora_stage == 1:
                    if not self._hora_launches[b]:
                        flat = self._hora_flat_of(b)
                        arrived = self._hora_arrived.setdefault(b, set())
                        for position in self._hora_layout.buckets[b].members:
                            p = self._hora_params[position]
                            if p not in arrived:
                                self._hora_copy_in(flat, position, p.grad)
                                arrived.add(p)
                        self._hora_launch(b)
                    continue
                if b in self._hora_flat:
                    self._hora_launch(b)
                # every rank starts the same passes, whatever its backward did
                while self._hora_launches[b] < self.backward_passes_per_step:
                    self._hora_launch(b)
            while self._hora_in_flight:
                self._hora_finish_oldest()
            if self._hora_replicas is not None:
                self._hora_reduce_across_replicas()
        finally:
            if not self._hora_in_flight:
                self._hora_reset_step()
            if self._hora_shards is not None:
                self._hora_shards.end_of_pass()
        self._hora_synchronized = True

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0,
                        error_if_nonfinite: bool = False) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the averaged gradients of
        every parameter, which with sharding lie in shards spread over the
        ranks: reduces the gradients first if :meth:`synchronize` has not
        run, computes the total norm across all shards (one allreduce of a
        scalar) and scales this rank's shards by ``max_norm / norm`` when the
        norm exceeds ``max_norm``. Every rank gets the same total norm back.
        Call it between ``backward()`` and ``step()``; ``step()`` then does
        not reduce again."""
        from hora.torch.mpi_ops import allreduce
        if not self._hora_member:
            return _clip_local(self, max_norm, norm_type, error_if_nonfinite)
        if not self._hora_synchronized:
            self.synchronize()
        self._hora_clipped = True
        norm_type = float(norm_type)
        shards = [s for s in self._hora_grad_shards if s.numel()]
        device = self._hora_grad_shards[0].device if self._hora_grad_shards else "cpu"
        if norm_type == float("inf"):
            local = max((s.abs().max().float() for s in shards),
                        default=torch.zeros((), device=device))
            total = allreduce(local.reshape(1).cpu(), op=Max,
                              name="DistributedOptimizer.clip_grad_norm_",
                              process_set=self._hora_process_set)[0]
        else:
            local = sum((torch.linalg.vector_norm(s.float(), norm_type) ** norm_type
                         for s in shards), torch.zeros((), device=device))
            total = allreduce(local.reshape(1).cpu().double(), op=Sum,
                              name="DistributedOptimizer.clip_grad_norm_",
                              process_set=self._hora_process_set)[0] ** (1.0 / norm_type)
            total = total.float()
        if error_if_nonfinite and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from the "
                               f"shards of every rank is non-finite, so it cannot be clipped. "
                               f"Set error_if_nonfinite=False to skip this check")
        coefficient = float(max_norm) / (float(total) + 1e-6)
        if coefficient < 1.0:
            with torch.no_grad():
                for shard in shards:
                    shard.mul_(coefficient)
        return total

    def step(self, closure=None):
        """Reduces the gradients (see :meth:`synchronize`), steps the wrapped
        optimizer on this rank's pieces and allgathers the updated pieces
        into every rank's parameters. ``closure`` is not supported: its
        backward pass would start reductions in the middle of the step."""
        if closure is not None:
            raise ValueError("DistributedOptimizer: step(closure) is not supported with "
                             "sharding; call backward() before step()")
        if not self._hora_member:
            self._hora_synchronized = self._hora_clipped = False
            return super().step()
        if self._hora_should_synchronize and not self._hora_clipped:
            if self._hora_synchronized and not self._hora_pending():
                warn_step_after_synchronize()
            else:
                self.synchronize()
        self._hora_synchronized = False
        self._hora_clipped = False
        self._hora_loaded = None
        if self._hora_shards is not None:
            # stage 3: the shards are stepped; the next forward gathers them
            with self._hora_pieces_as_params():
                return super().step()
        self._hora_check_flat()
        self._hora_refresh_pieces()
        with self._hora_pieces_as_params():
            result = super().step()
        self._hora_gather_parameters()
        return result

    @contextlib.contextmanager
    def gathered_parameters(self, writeback: bool = True):
        """Stage 3 (``sharding="parameters"``): a context in which every
        parameter of the model is whole on every rank (FSDP's
        ``summon_full_params``), to save or load ``model.state_dict()``,
        evaluate outside forward hooks or inspect weights. Collective (every
        rank of the process set enters it) and it costs the whole
        parameters' memory while it lasts. With ``writeback`` (default)
        changes made inside are kept: each rank copies its slice back into
        its shard on exit. Outside it, between forward passes, the
        parameters hold no memory. With other stages the parameters are
        always whole and this does nothing."""
        if self._hora_shards is None:
            yield
            return
        if self._hora_pending():
            raise RuntimeError("DistributedOptimizer.gathered_parameters(): gradients are being "
                               "reduced (after backward, before step); call it before backward "
                               "or after step()")
        with self._hora_shards.gathered(writeback):
            yield

    @contextlib.contextmanager
    def _hora_pieces_as_params(self):
        """The wrapped optimizer's groups hold this rank's pieces instead of
        the parameters while it steps (and while its state is inspected)."""
        saved = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [self._hora_pieces[p][1] for p in group["params"]
                                   if p in self._hora_pieces]
            yield
        finally:
            for group, params in zip(self.param_groups, saved):
                group["params"] = params

    def _hora_gather_parameters(self):
        """Allgathers every bucket's updated pieces into the parameters."""
        layout = self._hora_layout
        order = list(reversed(range(len(layout.buckets))))  # forward order
        started = collections.deque()

        def start(b):
            name = f"allgather.{self._hora_bucket_names[b]}"
            flat = self._hora_flat_params.get(b)
            if flat is not None:
                # this rank's rows already lie in the buffer the parameters view
                begin, end = layout.bounds(b, self._hora_rank)
                works = start_allgather_into(flat[begin:end], flat, name,
                                             process_set=self._hora_set)
                started.append((b, Handle(works, lambda ws: None)))
                return
            pieces = [self._hora_pieces[self._hora_params[piece.param]][1]
                      for piece in layout.pieces(self._hora_rank, b)]
            if len(pieces) == 1:
                shard = pieces[0]
            elif pieces:
                shard = torch.cat(pieces)
            else:
                head = self._hora_params[layout.buckets[b].members[0]]
                shard = torch.empty(0, dtype=head.dtype, device=head.device)
            works, finish = start_allgather([shard], [name], process_set=self._hora_set)
            started.append((b, Handle(works, lambda ws: finish(ws)[0])))

        for b in order[:_MAX_GATHERS_IN_FLIGHT]:
            start(b)
        following = order[_MAX_GATHERS_IN_FLIGHT:]
        while started:
            b, handle = started.popleft()
            if following:
                start(following.pop(0))
            try:
                flat = synchronize(handle)
            except HoraError as error:
                for _, other in started:
                    with contextlib.suppress(HoraError):
                        synchronize(other)
                raise self._hora_name_bucket(error, b) from None
            if flat is None:
                continue  # gathered in place
            bucket = layout.buckets[b]
            with torch.no_grad():
                for position, offset in zip(bucket.members, bucket.offsets):
                    p = self._hora_params[position]
                    values = flat[offset:offset + p.numel()]
                    if p.is_contiguous():
                        p.view(-1).copy_(values)
                    else:
                        p.copy_(values.view(p.shape))

    def zero_grad(self, *args, **kwargs):
        """The wrapped optimizer's ``zero_grad``; ``RuntimeError`` while
        gradients are being reduced (after backward, before step)."""
        if self._hora_member and self._hora_pending():
            raise zero_grad_while_reducing()
        return super().zero_grad(*args, **kwargs)

    def add_param_group(self, param_group):
        """Not supported once sharded: the buckets and shards are cut when
        the optimizer is wrapped. Add every group before wrapping."""
        if "_hora_layout" not in self.__dict__:
            return super().add_param_group(param_group)
        raise ValueError("DistributedOptimizer: add_param_group() is not supported with "
                         "sharding (the parameters were cut into shards when the optimizer "
                         "was wrapped); add every parameter group before wrapping")

    # checkpoints (hora.torch.sharded_checkpoint)

    def _torch_optimizer(self) -> Any:
        """The wrapped optimizer class's own methods (torch's state_dict
        and load_state_dict), past this class's."""
        return super()

    def state_dict(self) -> dict[str, Any]:
        """The full optimizer state, in torch's own format, on every rank:
        collective (every rank of the optimizer's process set calls it);
        gathers every shard's state, bucket by bucket, so each rank
        briefly holds the whole optimizer state. It loads into a sharded
        optimizer at any world size, or into a plain torch optimizer."""
        from hora.torch import sharded_checkpoint
        return sharded_checkpoint.full_state_dict(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a full state dict (from :meth:`state_dict` at any world
        size, or from a plain torch optimizer); each rank keeps its slice.
        Local: no communication."""
        from hora.torch import sharded_checkpoint
        sharded_checkpoint.load_full_state_dict(self, state_dict)

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's shard of the optimizer state, with the layout it was
        cut by: local, 1/N of the state. Save one per rank; load them back
        with :meth:`load_sharded_state_dict` at the same world size, or
        merge them with
        :func:`hora.torch.sharded_checkpoint.consolidate_sharded_state_dicts`."""
        from hora.torch import sharded_checkpoint
        return sharded_checkpoint.sharded_state_dict(self)

    def load_sharded_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads this rank's shard saved by :meth:`sharded_state_dict` (same
        parameters, world size and rank; ``ValueError`` otherwise)."""
        from hora.torch import sharded_checkpoint
        sharded_checkpoint.load_sharded_state_dict(self, state_dict)


def _clip_local(optimizer: Any, max_norm: float, norm_type: float,
                error_if_nonfinite: bool) -> torch.Tensor:
    """torch's clipping of the optimizer's own gradients (a rank outside the
    process set, whose gradients are not reduced)."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type,
                                          error_if_nonfinite=error_if_nonfinite)


# See optimizer.py: the wrapped class's step() already runs torch's hooks.
_ShardedOptimizer.step.hooked = True  # type: ignore[attr-defined]
