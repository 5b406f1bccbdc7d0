"""Parameters that live sharded (ZeRO stage 3, ``sharding="parameters"``).

Each bucket of the sharded optimizer's layout (:mod:`hora.common.shard_layout`)
owns one flat buffer, and while gathered its parameters are views of it.
Between uses the buffer's storage is resized to nothing (tensors autograd
saved from it keep pointing at that storage, which the next gather grows
back and fills) and each parameter's ``data`` is an empty tensor, so that
touching a freed parameter finds no elements rather than freed memory. Only
this rank's shard of the bucket stays, in a tensor of its own that the
wrapped optimizer steps.

The model's modules are split into *units*: the blocks of its
``ModuleList`` / ``Sequential`` / ``ModuleDict`` containers, and the model
itself for every other parameter (and any parameter two blocks share);
buckets never cross units. Around each unit:

- before its forward, its buckets are allgathered into their buffers and
  the next unit's gathers are started (prefetch);
- after its forward, its buckets are freed (the model's own unit after the
  whole forward);
- when backward reaches its outputs, its buckets are gathered again, and
  the next unit's in backward order started;
- once every gradient of a bucket is produced, the bucket is freed, while
  its reducescatter runs (see :mod:`hora.torch.sharded_optimizer`).

The gathers are collectives; see "the walks" below for how every rank
starts the same ones even when ranks skip different blocks. The model must
be called as a whole (its own forward starts a pass).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

import torch
from torch import nn

from hora.common._adapter.handles import Handle, synchronize
from hora.common.exceptions import HoraError
from hora.torch._collectives import global_process_set, start_allgather, start_allgather_into

# Containers whose children are the units (a transformer's blocks).
_CONTAINERS = (nn.ModuleList, nn.Sequential, nn.ModuleDict)


def find_units(model: nn.Module, params: list[torch.Tensor],
               names: dict[torch.Tensor, str]) -> list[tuple[nn.Module, list[int]]]:
    """``(module, positions of its parameters in params)`` for each unit, in
    the model's order, the model itself last (for the parameters of no other
    unit, and those shared between units). ``ValueError`` for an optimized
    parameter that is not the model's."""
    owned = {p for p in model.parameters()}
    for p in params:
        if p not in owned:
            raise ValueError(f"DistributedOptimizer(sharding='parameters'): the optimizer's "
                             f"parameter '{names.get(p, '?')}' is not a parameter of model")
        if _holder(p) is not None:
            raise ValueError(f"DistributedOptimizer(sharding='parameters'): parameter "
                             f"'{names.get(p, '?')}' is already held sharded by another "
                             f"DistributedOptimizer; wrap each model's optimizer once")
    wanted = set(params)
    modules: list[nn.Module] = []

    def walk(module: nn.Module) -> None:
        for child in module.children():
            if isinstance(module, _CONTAINERS) and any(p in wanted for p in child.parameters()):
                modules.append(child)
            else:
                walk(child)

    walk(model)
    if not modules:  # no containers: the model's children
        modules = [c for c in model.children() if any(p in wanted for p in c.parameters())]
    holders: dict[torch.Tensor, set[int]] = {}
    for k, module in enumerate(modules):
        for p in module.parameters():
            holders.setdefault(p, set()).add(k)
    position = {p: i for i, p in enumerate(params)}
    members: list[list[int]] = [[] for _ in range(len(modules) + 1)]
    for p in params:
        found = holders.get(p, set())
        # a parameter shared by two units lives in the model's own unit
        members[next(iter(found)) if len(found) == 1 else -1].append(position[p])
    units = [(m, positions) for m, positions in zip(modules, members) if positions]
    return units + [(model, members[-1])]


class ParameterShards:
    """The flat buffers, shards and gathers of the buckets, and the hooks
    that gather and free them around the units of a model."""

    def __init__(self, optimizer: Any, model: nn.Module, unit_buckets: list[list[int]],
                 modules: list[nn.Module]):
        self._optimizer = optimizer
        layout = optimizer._hora_layout
        self._layout = layout
        self._params = optimizer._hora_params
        self._rank = optimizer._hora_rank
        self._set = optimizer._hora_set
        self._units = unit_buckets           # unit -> its buckets
        self._modules = modules              # unit -> its module
        self.flat: list[torch.Tensor] = []   # bucket -> the buffer its parameters view
        self._views: list[list[tuple[torch.Tensor, torch.Tensor]]] = []  # (parameter, view)
        self._empty: list[torch.Tensor] = []  # bucket -> the no-element data of its freed params
        self.shards: list[torch.Tensor] = []  # bucket -> this rank's part, always there
        self._gathered: set[int] = set()
        self._pending: dict[int, tuple[Handle, bool]] = {}  # bucket -> gather in flight
        self._gathers = [0] * len(layout.buckets)
        # the units in the order forward walks them (the model's own unit,
        # then the blocks as registered); backward walks the model's own
        # unit first, then the blocks last to first
        self._root = modules.index(model)
        registration = {id(m): k for k, m in enumerate(model.modules())}
        blocks = [u for u in range(len(modules)) if u != self._root]
        blocks.sort(key=lambda u: registration[id(modules[u])])
        self._orders = {"forward": [self._root] + blocks,
                        "backward": [self._root] + blocks[::-1]}
        self._order_of = {kind: {u: k for k, u in enumerate(order)}
                          for kind, order in self._orders.items()}
        self._cursors: dict[str, int] = {}  # walk -> position of its next unit
        self._hooks: list[Any] = []
        self._model = model

    # --- set-up --------------------------------------------------------------

    def shard(self, broadcast_root: bool) -> None:
        """Moves every bucket's parameters into its flat buffer, makes the
        ranks agree on their values (the set's first rank's, as
        ``broadcast_parameters`` would), keeps this rank's shard and frees
        the buffer."""
        from hora.torch.mpi_ops import broadcast_
        for b, bucket in enumerate(self._layout.buckets):
            members = [self._params[position] for position in bucket.members]
            flat = torch.empty(bucket.numel, dtype=members[0].dtype, device=members[0].device)
            with torch.no_grad():
                for p, offset in zip(members, bucket.offsets):
                    view = flat[offset:offset + p.numel()].view(p.shape)
                    view.copy_(p)
                    p.data = view
            if broadcast_root:
                process_set = self._optimizer._hora_process_set
                root = 0 if process_set is global_process_set else process_set.ranks[0]
                broadcast_(flat, root, name=f"hora.sharding.parameters.{b}",
                           process_set=process_set)
            start, stop = self._layout.bounds(b, self._rank)
            self.flat.append(flat)
            self._views.append([(p, p.data) for p in members])
            self._empty.append(torch.empty(0, dtype=flat.dtype, device=flat.device))
            self.shards.append(flat[start:stop].clone())
            self._release(b)
            for p in members:
                p._hora_shards = weakref.ref(self)
        names = {p: name for name, p in self._model.named_parameters()}
        for module in self._model.modules():
            own = [p for p in module.parameters(recurse=False) if _holder(p) is self]
            if own:
                self._hooks.append(module.register_state_dict_post_hook(
                    lambda *args, own=own: self._check_whole(own, names, "state_dict")))
                self._hooks.append(module.register_load_state_dict_pre_hook(
                    lambda *args, own=own: self._check_whole(own, names, "load_state_dict")))
        for unit, module in enumerate(self._modules):
            self._hooks.append(module.register_forward_pre_hook(
                lambda module, args, unit=unit: self._before_forward(unit)))
            self._hooks.append(module.register_forward_hook(
                lambda module, args, output, unit=unit: self._after_forward(unit, output)))

    def detach(self) -> None:
        """Lets the parameters go (the optimizer cuts them again after the
        world changed in place): the hooks are removed, gathers in flight
        forgotten (they went with the old world) and every parameter is
        whole again, as zeros of its shape, for the state to be loaded."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        self._pending.clear()
        self._gathered.clear()
        self._cursors.clear()
        for views in self._views:
            for p, view in views:
                p.data = torch.zeros(view.shape, dtype=view.dtype, device=view.device)
                del p._hora_shards
        self.flat, self._views, self.shards = [], [], []

    def _check_whole(self, params: list[torch.Tensor], names: dict[torch.Tensor, str],
                     what: str) -> None:
        for p in params:
            if not self.is_whole(p):
                raise RuntimeError(
                    f"model.{what}(): parameter '{names.get(p, '?')}' is sharded "
                    f"(DistributedOptimizer(sharding='parameters')) and holds no values "
                    f"outside forward and backward; call it inside "
                    f"`with optimizer.gathered_parameters():` on every rank of the optimizer's "
                    f"process set")

    # --- gathers -------------------------------------------------------------

    def start(self, b: int) -> None:
        """Starts the allgather of bucket ``b`` unless it is there or coming."""
        if b in self._gathered or b in self._pending:
            return
        flat = self.flat[b]
        flat.untyped_storage().resize_(flat.numel() * flat.element_size())
        name = f"gather.{self._optimizer._hora_bucket_names[b]}.{self._gathers[b]}"
        self._gathers[b] += 1
        shard = self.shards[b]
        if flat.is_cpu:
            works = start_allgather_into(shard, flat, name, process_set=self._set)
            self._pending[b] = (Handle(works, lambda ws: None), False)
        else:  # a GPU result is a buffer of the engine's, copied in
            works, finish = start_allgather([shard], [name], process_set=self._set)
            self._pending[b] = (Handle(works, lambda ws: finish(ws)[0]), True)

    def wait(self, b: int) -> None:
        """Bucket ``b``'s parameters are there when this returns."""
        if b in self._gathered:
            return
        if b not in self._pending:
            self.start(b)
        handle, copy = self._pending.pop(b)
        try:
            result = synchronize(handle)
        except HoraError as error:
            self.drain()
            self._release(b)
            raise self._optimizer._hora_name_bucket(error, b, "parameters") from None
        if copy:
            with torch.no_grad():
                self.flat[b].copy_(result)
        for p, view in self._views[b]:
            p.data = view
        self._gathered.add(b)

    def free(self, b: int) -> None:
        if b in self._pending:
            handle, _ = self._pending.pop(b)
            with contextlib.suppress(HoraError):
                synchronize(handle)
        self._gathered.discard(b)
        self._release(b)

    def _release(self, b: int) -> None:
        """Bucket ``b`` holds no memory: its buffer's storage is emptied and
        its parameters' ``data`` are empty tensors."""
        _free(self.flat[b])
        for p, _ in self._views[b]:
            p.data = self._empty[b]

    def is_whole(self, p: torch.Tensor) -> bool:
        return self._layout.bucket_of[self._optimizer._hora_position[p]] in self._gathered

    def drain(self) -> None:
        """Waits for every gather in flight and frees its bucket (after an
        error: the engine may still write into their buffers)."""
        for b in list(self._pending):
            self.free(b)

    def free_all(self) -> None:
        for b in list(self._gathered) + list(self._pending):
            self.free(b)

    def gather_all(self) -> None:
        for b in range(len(self.flat)):
            self.start(b)
        for b in range(len(self.flat)):
            self.wait(b)

    # --- the walks ------------------------------------------------------------
    #
    # The gathers are collectives, so every rank must start the same ones.
    # A forward pass walks the units in a fixed order (the model, then its
    # blocks as registered) and a backward pass walks them the other way
    # (the model first, its outputs' gradient arriving first). Entering a
    # unit starts the gathers of every unit the walk passed over (a block
    # this rank skipped is gathered and freed at once: another rank may run
    # it), of the unit, and of the next one (prefetch); the end of the pass
    # starts what is left. Each rank therefore starts every unit once per
    # pass, in the same order, whatever blocks it skips. A unit entered
    # again, or against the order, is gathered once more, which every rank
    # must then do as well.

    def _enter(self, kind: str, unit: int) -> None:
        order = self._orders[kind]
        cursor = self._cursors.get(kind)
        position = self._order_of[kind][unit]
        if cursor is None or position < cursor:  # outside the walk
            self._start(self._units[unit])
        else:
            # the skipped units, this one and the next, in the walk's order
            self._start([b for u in order[cursor:position + 2] for b in self._units[u]])
            self._cursors[kind] = position + 1
            for u in order[cursor:position]:
                for b in self._units[u]:
                    self.free(b)
        for b in self._units[unit]:
            self.wait(b)

    def _finish_walk(self, kind: str) -> None:
        """Starts (and frees) what the walk has not reached."""
        cursor = self._cursors.pop(kind, None)
        if cursor is None:
            return
        rest = [b for u in self._orders[kind][cursor:] for b in self._units[u]]
        self._start(rest)
        for b in rest:
            self.free(b)

    def _start(self, buckets: list[int]) -> None:
        for b in buckets:
            self.start(b)

    # --- hooks -----------------------------------------------------------------

    def _before_forward(self, unit: int) -> None:
        if unit == self._root and torch._C._current_graph_task_id() < 0:
            self._finish_walk("backward")  # the last backward pass is over
            self._finish_walk("forward")
            self._cursors["forward"] = 0
        self._enter("forward", unit)

    def _after_forward(self, unit: int, output: Any) -> None:
        if torch._C._current_graph_task_id() >= 0:
            return  # recomputed inside backward (activation checkpointing)
        if unit == self._root:
            self._finish_walk("forward")
        for b in self._units[unit]:
            self.free(b)
        if not torch.is_grad_enabled():
            return
        tensors = [t for t in _tensors(output) if t.requires_grad]
        if tensors:
            torch.autograd.graph.register_multi_grad_hook(
                tensors, lambda grads, unit=unit: self._before_backward(unit), mode="any")

    def _before_backward(self, unit: int) -> None:
        if unit == self._root:
            self._finish_walk("backward")
            self._cursors["backward"] = 0
        self._enter("backward", unit)

    def end_of_pass(self) -> None:
        """After backward (from the optimizer's synchronize): finishes the
        walks and frees what is still gathered."""
        self._finish_walk("backward")
        self._finish_walk("forward")
        self.free_all()

    @contextlib.contextmanager
    def gathered(self, writeback: bool):
        self.gather_all()
        try:
            yield
        finally:
            if writeback:
                with torch.no_grad():
                    for b, flat in enumerate(self.flat):
                        start, stop = self._layout.bounds(b, self._rank)
                        self.shards[b].copy_(flat[start:stop])
            self.free_all()


def _holder(t: Any) -> ParameterShards | None:
    """The ParameterShards holding parameter ``t`` (its ``_hora_shards``)."""
    found = getattr(t, "_hora_shards", None)
    return found() if found is not None else None


def _free(flat: torch.Tensor) -> None:
    flat.untyped_storage().resize_(0)


def gathered_model(model: nn.Module, writeback: bool):
    """``optimizer.gathered_parameters(writeback)`` of the optimizer holding
    ``model``'s parameters sharded, or a context that does nothing."""
    for p in model.parameters():
        holder = _holder(p)
        if holder is not None:
            return holder.gathered(writeback)
    return contextlib.nullcontext()


@contextlib.contextmanager
def whole(tensors: list[torch.Tensor]):
    """Parameters of ``tensors`` held sharded (stage 3) and freed are
    gathered while the block runs, and what it wrote into them is kept
    (collective over their optimizers' process sets); other tensors are
    left alone."""
    holders = []
    for t in tensors:
        holder = _holder(t)
        if holder is not None and holder not in holders and not holder.is_whole(t):
            holders.append(holder)
    with contextlib.ExitStack() as stack:
        for holder in holders:
            stack.enter_context(holder.gathered(writeback=True))
        yield


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []
