"""Parameters that live sharded (ZeRO stage 3, ``sharding="parameters"``).

Each bucket of the sharded optimizer's layout (:mod:`hora.common.shard_layout`)
owns one flat buffer, and its parameters are views of it. Between uses the
buffer's storage is resized to nothing: only this rank's shard of the bucket
stays, in a tensor of its own that the wrapped optimizer steps. The model's
modules are split into *units* (the blocks of its ``ModuleList`` /
``Sequential`` containers, and the model itself for every other parameter);
buckets never cross units. Around each unit:

- before its forward, its buckets are allgathered into their buffers (the
  storage grown back, so every view and every tensor autograd saved sees the
  parameters again) and the next unit's gathers are started (prefetch);
- after its forward, its buckets are freed;
- when backward reaches its outputs, its buckets are gathered again (and the
  next unit's, in backward order, started);
- once every gradient of a bucket is produced, the bucket is freed, while
  its reducescatter runs (see :mod:`hora.torch.sharded_optimizer`).

Every rank must run the same units in the same order (the gathers are
collectives); the order is recorded on the first pass and used to prefetch.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from hora.common._adapter.handles import Handle, synchronize
from hora.common.exceptions import HoraError
from hora.torch._collectives import start_allgather, start_allgather_into

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
        self.shards: list[torch.Tensor] = []  # bucket -> this rank's part, always there
        self._gathered: set[int] = set()
        self._pending: dict[int, tuple[Handle, bool]] = {}  # bucket -> gather in flight
        self._gathers = [0] * len(layout.buckets)
        self._forward_order: list[int] = []
        self._backward_order: list[int] = []
        self._orders_done = False
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
                broadcast_(flat, 0, name=f"hora.sharding.parameters.{b}",
                           process_set=self._optimizer._hora_process_set)
            start, stop = self._layout.bounds(b, self._rank)
            self.flat.append(flat)
            self.shards.append(flat[start:stop].clone())
            _free(flat)
        for unit, module in enumerate(self._modules):
            self._hooks.append(module.register_forward_pre_hook(
                lambda module, args, unit=unit: self._before_forward(unit)))
            self._hooks.append(module.register_forward_hook(
                lambda module, args, output, unit=unit: self._after_forward(unit, output)))

    def storages(self) -> list[Any]:
        return [flat.untyped_storage() for flat in self.flat]

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
            _free(self.flat[b])
            raise self._optimizer._hora_name_bucket(error, b, "parameters") from None
        if copy:
            with torch.no_grad():
                self.flat[b].copy_(result)
        self._gathered.add(b)

    def free(self, b: int) -> None:
        if b in self._pending:
            handle, _ = self._pending.pop(b)
            with contextlib.suppress(HoraError):
                synchronize(handle)
        self._gathered.discard(b)
        _free(self.flat[b])

    def drain(self) -> None:
        """Waits for every gather in flight (after an error: the engine may
        still write into their buffers)."""
        for b, (handle, _) in list(self._pending.items()):
            with contextlib.suppress(HoraError):
                synchronize(handle)
            self._pending.pop(b, None)
            self._gathered.add(b)

    def free_all(self) -> None:
        for b in list(self._gathered) + list(self._pending):
            self.free(b)

    def gather_all(self) -> None:
        for b in range(len(self.flat)):
            self.start(b)
        for b in range(len(self.flat)):
            self.wait(b)

    def gather_unit(self, unit: int, following: int | None) -> None:
        buckets = self._units[unit]
        for b in buckets:
            self.start(b)
        if following is not None:
            for b in self._units[following]:
                self.start(b)
        for b in buckets:
            self.wait(b)

    # --- hooks ---------------------------------------------------------------

    def _next(self, order: list[int], unit: int) -> int | None:
        if not self._orders_done:
            return None
        try:
            k = order.index(unit)
        except ValueError:
            return None
        return order[k + 1] if k + 1 < len(order) else None

    def _before_forward(self, unit: int) -> None:
        if not self._orders_done and unit not in self._forward_order:
            self._forward_order.append(unit)
        self.gather_unit(unit, self._next(self._forward_order, unit))

    def _after_forward(self, unit: int, output: Any) -> None:
        if torch._C._current_graph_task_id() >= 0:
            return  # recomputed inside backward (activation checkpointing)
        for b in self._units[unit]:
            self.free(b)
        if not torch.is_grad_enabled():
            return
        tensors = [t for t in _tensors(output) if t.requires_grad]
        if tensors:
            torch.autograd.graph.register_multi_grad_hook(
                tensors, lambda grads, unit=unit: self._before_backward(unit), mode="any")

    def _before_backward(self, unit: int) -> None:
        if not self._orders_done and unit not in self._backward_order:
            self._backward_order.append(unit)
        self.gather_unit(unit, self._next(self._backward_order, unit))

    def end_of_pass(self) -> None:
        """After backward (from the optimizer's synchronize): frees what is
        still gathered and fixes the orders recorded on the first pass."""
        self.free_all()
        if self._forward_order:
            self._orders_done = True

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


def _free(flat: torch.Tensor) -> None:
    flat.untyped_storage().resize_(0)


def _tensors(output: Any) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    if isinstance(output, dict):
        return [t for item in output.values() for t in _tensors(item)]
    return []
