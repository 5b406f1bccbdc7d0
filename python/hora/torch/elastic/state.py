"""``TorchState``: models, optimizers and ElasticSamplers among the state's
attributes are saved, restored and synced with PyTorch's own state dicts,
through handlers chosen by type from a registry (Horovod's
``get_handler_registry`` / ``set_handler_registry``, which scripts extend
with handlers of their own); the other attributes as picklable objects."""

from __future__ import annotations

import copy
from typing import Any

import torch

from hora._loader import _C
from hora.common.elastic import ObjectState
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from hora.torch.parameter_sharding import gathered_model
from hora.torch._collectives import global_process_set
from hora.torch.sharded_optimizer import _ShardedOptimizer


class StateHandler:
    """Keeps one attribute of a :class:`TorchState` (Horovod's
    ``StateHandler``): ``save()`` copies ``value``'s state, ``restore()``
    puts the copy back, ``sync()`` makes every rank's rank 0's (collective),
    and ``set_value()`` is called when the attribute is given a new
    object. Register a subclass for a type with
    :func:`set_handler_registry`."""

    def __init__(self, value: Any):
        self.value = value

    def save(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement save()")

    def restore(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement restore()")

    def sync(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} does not implement sync()")

    def set_value(self, value: Any) -> None:
        self.value = value
        self.save()


class _Captured(StateHandler):
    """hora's own handlers: ``capture()`` returns the copy ``save()`` keeps
    as ``saved`` (TorchState takes every handler's before it keeps any, and
    writes ``saved`` to disk at a commit)."""

    saved: Any

    def save(self) -> None:
        self.saved = self.capture()

    def capture(self) -> Any:
        raise NotImplementedError


class ModelStateHandler(_Captured):
    """A model's state dict. A model whose parameters a sharded optimizer
    holds (``sharding="parameters"``) is gathered whole for each of these,
    on every rank together (commit, restore and sync are collective)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__(model)
        self.saved: dict[str, Any] = {}
        # a process waiting to join an elastic world in place takes no part
        # in collectives (sharded weights are gathered) and takes the
        # world's state when it joins
        if not _C.joining():
            self.save()

    def capture(self) -> dict[str, Any]:
        with gathered_model(self.value, writeback=False):
            return {k: v.detach().clone() for k, v in self.value.state_dict().items()}

    def restore(self) -> None:
        with gathered_model(self.value, writeback=True):
            self.value.load_state_dict(self.saved)

    def sync(self) -> None:
        with gathered_model(self.value, writeback=True):
            broadcast_parameters(self.value.state_dict(), root_rank=0)


class StateDictHandler(_Captured):
    """Kept through the value's own ``state_dict`` / ``load_state_dict``,
    synced by broadcasting rank 0's state dict (learning-rate schedulers and
    ``torch.amp.GradScaler`` are kept this way)."""

    def __init__(self, value: Any):
        super().__init__(value)
        self.saved: dict[str, Any] = {}
        self.save()

    def capture(self) -> Any:
        return copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(copy.deepcopy(self.saved))

    def sync(self) -> None:
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), root_rank=0))


class OptimizerStateHandler(StateDictHandler):
    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)
        # a stateful compressor (PowerSGD) starts again in the new world:
        # its errors were the old ranks' own, and its Q must match everywhere
        compression: Any = getattr(self.value, "_hora_compression", None)
        if getattr(compression, "stateful", False):
            compression.reset()
        # local SGD counts its steps and takes its anchor again
        reset = getattr(self.value, "_hora_local_reset", None)
        if reset is not None:
            reset()


class _ShardedOptimizerState(_Captured):
    """A sharded optimizer's state: every rank keeps its own shard (1/N of
    the state, no communication at commit) and writes it to its host's disk
    as its part of the commit; a new world, of any size, merges the parts
    and each rank keeps its slice of the result."""

    def __init__(self, value: Any):
        super().__init__(value)
        self.saved: dict[str, Any] = {}
        self.save()

    def capture(self) -> dict[str, Any]:
        return copy.deepcopy(self.value.sharded_state_dict())

    def restore(self) -> None:
        from hora.torch.sharded_checkpoint import FORMAT
        if FORMAT in self.saved:
            self.value.load_sharded_state_dict(copy.deepcopy(self.saved))
        else:  # merged from a commit's parts: cut this rank's slice again
            self.value.load_state_dict(self.saved)
            self.value._hora_loaded = None
            self.save()

    def sync(self) -> None:
        broadcast_optimizer_state(self.value, root_rank=0)

    def sync_hyperparameters(self) -> None:
        """Rank 0's parameter groups' settings (learning rate and the
        like), everywhere; the state itself stays each rank's shard."""
        groups = broadcast_object([{k: v for k, v in group.items() if k != "params"}
                                   for group in self.value.param_groups], root_rank=0)
        for group, values in zip(self.value.param_groups, groups):
            group.update(values)

    def snapshot(self) -> Any:
        return {_PARTS: self.value._hora_layout.size}

    def parts_needed(self) -> int:
        return int(self.saved.get(_PARTS, 0))

    def load_parts(self, shards: list[Any]) -> None:
        from hora.torch.sharded_checkpoint import consolidate_sharded_state_dicts
        self.saved = consolidate_sharded_state_dicts(shards)


_PARTS = "hora-sharded-parts"


class SamplerStateHandler(StateDictHandler):
    """An :class:`ElasticSampler`'s epoch and progress."""


class _HostTensor:
    """A tensor in a snapshot, as a NumPy array: pickling that writes the
    array's memory straight to the file (protocol 5), without the GIL-bound
    serialization torch uses for its own storages, so the background writer
    leaves the training thread alone."""

    __slots__ = ("array", "dtype", "shape")

    def __init__(self, tensor: torch.Tensor):
        tensor = tensor.detach().cpu().contiguous()
        self.dtype = tensor.dtype
        self.shape = tuple(tensor.shape)
        if tensor.dtype == torch.bfloat16:  # NumPy has no bfloat16: its bits
            tensor = tensor.view(torch.int16)
        self.array = tensor.numpy()

    def __getstate__(self) -> Any:
        return (self.array, str(self.dtype).replace("torch.", ""), self.shape)

    def __setstate__(self, state: Any) -> None:
        self.array, dtype, self.shape = state
        self.dtype = getattr(torch, dtype)

    def tensor(self) -> torch.Tensor:
        t = torch.from_numpy(self.array)
        if self.dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        return t.reshape(self.shape)


def _to_host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return _HostTensor(value)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_host(v) for v in value)
    return value


def _from_host(value: Any) -> Any:
    if isinstance(value, _HostTensor):
        return value.tensor()
    if isinstance(value, dict):
        return {k: _from_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_from_host(v) for v in value)
    return value


_handler_registry: list[tuple[type, type]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
    (torch.optim.lr_scheduler.LRScheduler, StateDictHandler),
    (torch.amp.GradScaler, StateDictHandler),
]


def get_handler_registry() -> list[tuple[type, type]]:
    """The ``(type, handler class)`` pairs :class:`TorchState` picks a
    handler from, first match first (Horovod's function)."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type]]) -> None:
    """Replaces the registry (Horovod's function); TorchStates made after
    use it."""
    global _handler_registry
    _handler_registry = registry


def _handler_class(value: Any) -> type | None:
    if isinstance(value, _ShardedOptimizer) and value._hora_member:
        return _ShardedOptimizerState
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler
    return None


def _handler(value: Any) -> Any:
    kind = _handler_class(value)
    return None if kind is None else kind(value)


def _snapshot_of(handler: Any) -> Any:
    """What a commit writes to disk of ``handler``. For a handler of the
    script's own: its attributes but the live object (what its ``save()``
    copied)."""
    if isinstance(handler, _ShardedOptimizerState):
        return handler.snapshot()
    if isinstance(handler, _Captured):
        return _to_host(handler.saved)
    return _to_host({k: v for k, v in vars(handler).items() if k != "value"})


class TorchState(ObjectState):
    """Elastic state of a PyTorch training loop, Horovod's ``TorchState``:
    ``TorchState(model=model, optimizer=optimizer, epoch=0, batch=0)``. Every
    keyword becomes an attribute. Values of a type in the handler registry
    (models, optimizers, ``ElasticSampler``, learning-rate schedulers,
    ``GradScaler``, and what the script registers) are kept through their
    handlers; giving such an attribute a new object hands it to the handler
    (``set_value``), which saves it. Anything else must be picklable."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any):
        kwargs.update(model=model, optimizer=optimizer)
        self._handlers: dict[str, Any] = {}
        self._part_taken = False  # take_part() saved the shards for the next save()
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _handler(value)
            if handler is None:
                plain[name] = value
            else:
                self._handlers[name] = handler
                setattr(self, name, value)
        super().__init__(bcast_object=broadcast_object, **plain)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and name in self.__dict__:
            handler: Any = handlers[name]
            kind = _handler_class(value)
            if kind is None:
                raise TypeError(f"TorchState: {name} is kept by {type(handler).__name__}; it "
                                f"cannot become a {type(value).__name__}, which no handler "
                                f"in the registry keeps")
            if kind is type(handler):
                handlers[name].set_value(value)
            else:  # an optimizer that became sharded, or the like
                handlers[name] = kind(value)
        super().__setattr__(name, value)

    def save(self) -> None:
        taken, self._part_taken = self._part_taken, False
        # all or nothing: a model held in shards is gathered (collective),
        # and a rank lost meanwhile must leave the last commit whole
        captured = {name: handler.capture() for name, handler in self._handlers.items()
                    if isinstance(handler, _Captured)
                    and not (taken and isinstance(handler, _ShardedOptimizerState))}
        for name, value in captured.items():
            self._handlers[name].saved = value
        for handler in self._handlers.values():
            if not isinstance(handler, _Captured):
                handler.save()
        super().save()

    def holds_shards(self) -> bool:
        return any(isinstance(h, _ShardedOptimizerState) for h in self._handlers.values())

    def recuts_in_place(self) -> bool:
        return self.holds_shards() and all(
            h.value._hora_process_set is global_process_set and h.value._hora_replicas is None
            for h in self._sharded().values())

    def take_part(self) -> Any:
        sharded = self._sharded()
        if not sharded:
            return None
        for handler in sharded.values():
            handler.save()
        self._part_taken = True  # save() keeps these
        return self.snapshot_part()

    def recut(self) -> None:
        for handler in self._sharded().values():
            handler.value._hora_recut()

    def drop_step_in_flight(self) -> None:
        for handler in self._handlers.values():
            drop = getattr(handler.value, "_hora_drop_step", None)
            if drop is not None:
                drop()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def sync_replicated(self) -> None:
        for handler in self._handlers.values():
            if isinstance(handler, _ShardedOptimizerState):
                handler.sync_hyperparameters()
            else:
                handler.sync()
        super().sync()

    def snapshot(self) -> Any:
        return {"objects": self._saved_state,
                "handlers": {name: _snapshot_of(h) for name, h in self._handlers.items()}}

    def load_snapshot(self, snapshot: Any) -> None:
        super().load_snapshot(snapshot)
        for name, saved in snapshot["handlers"].items():
            if name not in self._handlers:
                raise ValueError(f"TorchState: the committed state has {name!r}, which this "
                                 f"state does not (was it created with other arguments?)")
            handler = self._handlers[name]
            if isinstance(handler, _Captured):
                handler.saved = _from_host(saved)
            else:
                for key, value in _from_host(saved).items():
                    setattr(handler, key, value)

    def _sharded(self) -> dict[str, _ShardedOptimizerState]:
        return {name: h for name, h in self._handlers.items()
                if isinstance(h, _ShardedOptimizerState)}

    def snapshot_part(self) -> Any:
        sharded = self._sharded()
        return {name: _to_host(h.saved) for name, h in sharded.items()} if sharded else None

    def parts_needed(self) -> int:
        return max((h.parts_needed() for h in self._sharded().values()), default=0)

    def load_parts(self, parts: list[Any]) -> None:
        for name, handler in self._sharded().items():
            handler.load_parts([_from_host(part[name]) for part in parts])
