"""Broadcasting model parameters, optimizer state and Python objects.

Each function takes ``process_set`` (default: every rank): with a
:class:`hora.ProcessSet` it runs among that set's ranks only, which alone
call it; ``root_rank`` stays a global rank, one of the set's.
"""

from __future__ import annotations

import collections.abc
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hora.common import ops as _ops
from hora.common._adapter.handles import wait_all
from hora.common.basics import rank
from hora.torch import mpi_ops
from hora.torch._collectives import (
    ProcessSet, check_root, check_tensor, global_process_set, set_id, set_object)
from hora.torch.optimizer import _local_step
from hora.torch.parameter_sharding import whole
from hora.torch.sharded_optimizer import _ShardedOptimizer


def broadcast_parameters(params: Mapping[str, torch.Tensor]
                         | Iterable[torch.Tensor | tuple[str, torch.Tensor]], root_rank: int,
                         process_set: ProcessSet = global_process_set) -> None:
    """Overwrites every rank's tensors with ``root_rank``'s, in place.

    ``params`` is a dict of name -> tensor (``model.state_dict()``; entries
    are broadcast in sorted key order) or an iterable of tensors or of
    ``(name, tensor)`` pairs (``model.parameters()``,
    ``model.named_parameters()``). Every rank must pass the same names,
    shapes and dtypes in the same order. With ``process_set`` only that
    set's ranks take part (and call it). Raises ``ValueError`` for another
    kind of ``params``, repeated names, a process set this rank is not in or
    a root outside it, ``TypeError`` for an entry that is not a tensor,
    :class:`hora.HoraMismatchError` when ranks disagree.
    """
    set_id(process_set, "broadcast_parameters")
    root_rank = check_root(root_rank, "broadcast_parameters")
    if isinstance(params, collections.abc.Mapping):
        entries = sorted(params.items(), key=lambda item: str(item[0]))
    elif isinstance(params, collections.abc.Iterable) and not isinstance(params, torch.Tensor):
        entries = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"broadcast_parameters: params must be a dict (a state_dict) or a list "
                         f"of tensors or (name, tensor) pairs, got {type(params).__name__}")
    names = [str(name) for name, _ in entries if name is not None]
    if len(set(names)) != len(names):
        raise ValueError("broadcast_parameters: parameter names are repeated")
    for name, tensor in entries:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"broadcast_parameters: '{name}' is a {type(tensor).__name__}, "
                            f"not a tensor")
    # parameters held sharded (sharding="parameters") take part whole
    with whole([tensor for _, tensor in entries]):
        for name, tensor in entries:
            check_tensor(tensor, f"broadcast_parameters '{name}'")
        handles = [mpi_ops.broadcast_async_(
            tensor, root_rank, None if name is None else f"broadcast_parameters.{name}",
            process_set) for name, tensor in entries]
        wait_all(handles)


def _options(group):
    return {key: value for key, value in group.items() if key not in ("params", "param_names")}


def _describe(optimizer):
    """The root's optimizer as plain data: each group's options, and for each
    parameter its state entries (tensors as shape/dtype, others as values)."""
    groups = []
    for group in optimizer.param_groups:
        entries = []
        for p in group["params"]:
            state = optimizer.state.get(p)
            if not state:
                entries.append(None)
                continue
            entries.append({key: ("tensor", tuple(value.shape), value.dtype)
                            if isinstance(value, torch.Tensor) else ("value", value)
                            for key, value in state.items()})
        groups.append((_options(group), entries))
    return groups


def _sparse_parameters(optimizer, model):
    """The parameters whose gradients are sparse: all of SparseAdam's, those
    of the model's sparse embeddings, and those holding a sparse gradient."""
    if isinstance(optimizer, torch.optim.SparseAdam):
        return {p for group in optimizer.param_groups for p in group["params"]}
    sparse = set()
    if model is not None:
        for module in model.modules():
            if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and module.sparse:
                sparse.update(module.parameters())
    for group in optimizer.param_groups:
        sparse.update(p for p in group["params"] if p.grad is not None and p.grad.is_sparse)
    return sparse


def _zero_gradients(optimizer, model):
    """Gives every parameter that requires grad a zero gradient (sparse
    where the optimizer needs one), as Horovod's state-creating step does;
    returns (parameter, its data, its gradient before) for each."""
    sparse = _sparse_parameters(optimizer, model)
    saved = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                saved.append((p, p.detach().clone(), p.grad))
                zeros = torch.zeros_like(p)
                p.grad = zeros.to_sparse() if p in sparse else zeros
    return saved


def _initialize_state(optimizer, model):
    """Creates lazily built state the way Horovod does: one step with zero
    gradients (sparse ones where the optimizer needs them), which stay on
    the parameters afterwards, as Horovod leaves them. The parameters are
    restored, so options such as weight decay do not move them."""
    saved = _zero_gradients(optimizer, model)
    try:
        _local_step(optimizer)
    except BaseException:
        for p, _, grad in saved:
            p.grad = grad
        raise
    finally:
        with torch.no_grad():
            for p, data, _ in saved:
                p.copy_(data)


def _fit_state(optimizer, description):
    """Makes this rank's state hold the root's entries (values still to be
    broadcast for tensors) and its groups the root's options."""
    for group, (options, entries) in zip(optimizer.param_groups, description):
        group.update(options)
        for p, entry in zip(group["params"], entries):
            if entry is None:
                optimizer.state.pop(p, None)
                continue
            state = optimizer.state[p]
            for key in [k for k in state if k not in entry]:
                del state[key]
            for key, spec in entry.items():
                if spec[0] == "value":
                    state[key] = spec[1]
                    continue
                _, shape, dtype = spec
                current = state.get(key)
                if (not isinstance(current, torch.Tensor) or tuple(current.shape) != shape
                        or current.dtype != dtype):
                    # Per-parameter buffers live with the parameter; scalars such
                    # as Adam's step stay in host memory, as torch keeps them.
                    device = p.device if tuple(p.shape) == shape else torch.device("cpu")
                    state[key] = torch.zeros(shape, dtype=dtype, device=device)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int,
                              model: torch.nn.Module | None = None,
                              process_set: ProcessSet = global_process_set) -> None:
    """Makes every rank's optimizer state and hyper-parameters equal to
    ``root_rank``'s.

    Works on a plain torch optimizer or a :func:`DistributedOptimizer`.
    Scalar hyper-parameters (``lr``, ``momentum``, ``betas``, ...) of every
    parameter group and per-parameter state (tensors such as momentum
    buffers and Adam moments, and plain values) are taken from the root.
    When the root has state but this rank has none yet (optimizers create
    it lazily on the first step), it is first created as Horovod does, by
    one step with zero gradients (sparse ones for ``SparseAdam`` and for
    the sparse embeddings of ``model``, when given), and then overwritten
    with the root's; the parameters are left untouched (Horovod's step
    moves them where weight decay applies). When the root has no state
    yet, nothing but the hyper-parameters is sent: the state will then be
    created identically on every rank by the first step (Horovod's step
    would put weight decay into fresh momentum buffers). Either way, a
    rank that had no state ends with a zero gradient on every parameter
    that requires grad, as Horovod leaves it. Parameters without a
    gradient or without state are handled. Every rank must hold the same
    parameters in the same groups. With ``process_set`` only that set's
    ranks take part (and call it). Raises ``ValueError`` for
    ``torch.optim.LBFGS`` (its state is not per-parameter), for a process set
    this rank is not in or a root outside it, or (on every rank) when the
    ranks' parameter groups differ in layout; when creating the state fails
    on some rank, every rank raises ``RuntimeError`` naming the rank and its
    error.

    A sharded optimizer (``DistributedOptimizer(..., sharding=...)``) holds
    a different slice of the state on every rank, so there is nothing to
    copy from the root but its hyper-parameters, unless the root has just
    loaded a full state dict (``optimizer.load_state_dict(...)`` on the
    root only, as Horovod scripts resume): that state is then broadcast,
    one tensor at a time, and every rank keeps its slice.
    """
    set_id(process_set, "broadcast_optimizer_state")
    process_set = set_object(process_set)
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("broadcast_optimizer_state: cannot broadcast torch.optim.LBFGS state")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"broadcast_optimizer_state: expected a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    root_rank = check_root(root_rank, "broadcast_optimizer_state")
    if isinstance(optimizer, _ShardedOptimizer) and optimizer._hora_member:
        return _broadcast_sharded_state(optimizer, root_rank, process_set)
    is_root = rank() == root_rank
    had_state = any(optimizer.state.get(p) for group in optimizer.param_groups
                    for p in group["params"])
    description = _ops.broadcast_object(_describe(optimizer) if is_root else None, root_rank,
                                        name="broadcast_optimizer_state.layout",
                                        process_set=process_set)
    layout = [len(group["params"]) for group in optimizer.param_groups]
    root_layout = [len(entries) for _, entries in description]
    problem = None
    if layout != root_layout:
        problem = (f"rank {rank()} has parameter groups of sizes {layout} but root rank "
                   f"{root_rank} has {root_layout}")
    problems = [p for p in _ops.allgather_object(problem, name="broadcast_optimizer_state.check",
                                                 process_set=process_set)
                if p is not None]
    if problems:
        raise ValueError("broadcast_optimizer_state: " + "; ".join(problems))

    failure = None
    try:
        root_has_state = any(entry is not None for _, entries in description
                             for entry in entries)
        if not is_root and root_has_state and not had_state:
            _initialize_state(optimizer, model)
        elif not had_state:
            _zero_gradients(optimizer, model)
        if not is_root:
            _fit_state(optimizer, description)
    except Exception as error:  # reported on every rank below, so none hangs
        failure = f"rank {rank()}: {type(error).__name__}: {error}"
    failures = [f for f in _ops.allgather_object(failure, name="broadcast_optimizer_state.init",
                                                 process_set=process_set)
                if f is not None]
    if failures:
        raise RuntimeError("broadcast_optimizer_state: creating the optimizer state failed on "
                           + "; ".join(failures))

    handles = []
    for i, (group, (_, entries)) in enumerate(zip(optimizer.param_groups, description)):
        for j, (p, entry) in enumerate(zip(group["params"], entries)):
            if entry is None:
                continue
            state = optimizer.state[p]
            for key, spec in entry.items():
                if spec[0] == "tensor":
                    handles.append(mpi_ops.broadcast_async_(
                        state[key], root_rank, name=f"broadcast_optimizer_state.{i}.{j}.{key}",
                        process_set=process_set))
    wait_all(handles)


def _broadcast_sharded_state(optimizer, root_rank, process_set):
    """broadcast_optimizer_state of a sharded optimizer (see there)."""
    from hora.torch import sharded_checkpoint
    loaded = optimizer._hora_loaded if rank() == root_rank else None
    skeleton = None
    if loaded is not None:
        skeleton = {number: {key: ("tensor", tuple(v.shape), v.dtype)
                             if isinstance(v, torch.Tensor) else ("value", v)
                             for key, v in entry.items()}
                    for number, entry in loaded["state"].items()}
    options, skeleton = _ops.broadcast_object(
        ([_options(group) for group in optimizer.param_groups], skeleton), root_rank,
        name="broadcast_optimizer_state.sharded", process_set=process_set)
    if len(options) != len(optimizer.param_groups):
        raise ValueError(f"broadcast_optimizer_state: rank {rank()} has "
                         f"{len(optimizer.param_groups)} parameter groups but root rank "
                         f"{root_rank} has {len(options)}")
    for group, values in zip(optimizer.param_groups, options):
        group.update(values)
    optimizer._hora_loaded = None
    if skeleton is None:
        return
    params = {number: p for p, number in sharded_checkpoint.numbering(optimizer).items()}
    sliced = {}
    for number in sorted(skeleton):
        full = {}
        for key, spec in skeleton[number].items():
            if spec[0] == "value":
                full[key] = spec[1]
                continue
            # through host memory: a checkpoint may sit on another device
            # on the root than this rank's parameters
            tensor = (loaded["state"][number][key].detach().cpu() if loaded is not None
                      else torch.empty(spec[1], dtype=spec[2]))
            full[key] = mpi_ops.broadcast(tensor, root_rank,
                                          name=f"broadcast_optimizer_state.{number}.{key}",
                                          process_set=process_set)
        param = params[number]
        full = {key: value.to(param.device) if isinstance(value, torch.Tensor)
                and value.dim() > 0 else value for key, value in full.items()}
        sharded_checkpoint.keep_slice(optimizer, param, full, sliced)
    optimizer.state.clear()
    optimizer.state.update(sliced)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``root_rank``'s picklable ``obj`` on every rank (of
    ``process_set``; the root gets its own object back). Raises
    ``ValueError`` for a process set this rank is not in or a root outside it."""
    set_id(process_set, "broadcast_object")
    return _ops.broadcast_object(obj, check_root(root_rank, "broadcast_object"), name,
                                 process_set=set_object(process_set))


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Returns the list of every rank's picklable ``obj``, in rank order (the
    members of ``process_set``, in the set's order). Raises ``ValueError``
    for a process set this rank is not in."""
    set_id(process_set, "allgather_object")
    return _ops.allgather_object(obj, name, process_set=set_object(process_set))
