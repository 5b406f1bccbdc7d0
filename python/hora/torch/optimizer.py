"""DistributedOptimizer: averages gradients over all ranks before each step.

``DistributedOptimizer(opt)`` returns an object of a subclass of
``type(opt)`` created on the fly, sharing ``opt``'s parameter groups, state
and defaults, so it behaves like the optimizer it wraps (``param_groups``,
``state``, ``state_dict``/``load_state_dict``, ``add_param_group``, LR
schedulers, ``isinstance`` checks). A hook on each parameter notes when
autograd has accumulated its gradient. Gradients travel in buckets (see
:func:`hora.common.gradient_policy.bucket_units`): a bucket's allreduce
starts, as one grouped submission, as soon as its last gradient is ready, so
communication overlaps the rest of the backward pass; ``step()`` waits for
all of them and then runs the wrapped optimizer's update. With
``bucket_bytes=0`` (or ``HORA_GRADIENT_BUCKET_BYTES=0``) every gradient is
reduced on its own under its parameter's name, as Horovod does.

With ``process_set=`` the gradients are reduced among that set's ranks only
(averaged over the set's size); on a rank outside the set no gradient is
reduced and ``step()`` applies the rank's own gradients, as in Horovod.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from hora.common.basics import Adasum, Average, ReduceOp
from hora.common.compression import Compressor
from hora.common.gradient_policy import (
    bucket_units, check_backward_passes, gradient_policy, group_units)
from hora._loader import _C
from hora.torch._collectives import (
    ProcessSet, global_process_set, set_id, set_object, set_size)
from hora.torch.adasum_optimizer import _DistributedAdasumOptimizer
from hora.torch.compression import Compression
from hora.torch.local_sgd import _LocalSGDOptimizer
from hora.torch.sharded_optimizer import SHARDED_BUCKET_BYTES, _ShardedOptimizer
from hora.torch.parameter_sharding import find_units
from hora.torch.sharding_checks import (
    check_elementwise, check_model, check_replicas, check_same_parameters, check_sharding)
from hora.torch.replicated_optimizer import _BUCKET_PREFIX, _UNNAMED, _DistributedOptimizer

_CLASSES: dict[type, type] = {}


def _parameter_names(optimizer, named_parameters):
    """Each parameter's name, as Horovod keeps it in
    ``optimizer._parameter_names``: the given name, or
    ``allreduce.noname.<group>.<index>`` without ``named_parameters``. Its
    gradient's allreduce is named ``allreduce.<that name>``."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: f"{_UNNAMED}.{i}.{j}"
                for i, group in enumerate(optimizer.param_groups)
                for j, p in enumerate(group["params"])}
    entries = list(named_parameters)
    for entry in entries:
        if (not isinstance(entry, tuple) or len(entry) != 2 or not isinstance(entry[0], str)
                or not entry[0] or not isinstance(entry[1], torch.Tensor)):
            raise ValueError(
                "named_parameters should be a sequence of tuples (name, parameter), usually "
                "produced by model.named_parameters(). (hora: names must be non-empty str; got "
                f"the entry {entry!r:.80})")
    seen, duplicates = set(), set()
    for name, _ in entries:
        if name in seen:
            duplicates.add(name)
        seen.add(name)
    if duplicates:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         + ", ".join(sorted(duplicates)))
    names = {}
    for name, p in entries:
        names.setdefault(p, name)
    unnamed = [i for i, p in enumerate(params) if p not in names]
    if unnamed:
        raise ValueError(
            f"named_parameters was specified, but one or more model parameters were not named. "
            f"Python object ids: {', '.join(str(id(params[i])) for i in unnamed)} (hora: "
            f"{len(unnamed)} of the optimizer's parameters, at positions {unnamed[:10]} in its "
            f"parameter order; name every parameter, e.g. with model.named_parameters())")
    return {p: names[p] for p in params}


def _bucket_name(members, names):
    """A bucket's collective name, from its parameters' names: distinct for
    two optimizers over differently named parameters, as Horovod's
    per-parameter names are."""
    first, last = names[members[0]], names[members[-1]]
    return f"{_BUCKET_PREFIX}{first}..{last}.{len(members)}"


def _split_units(params, groups, what, names, bucket_bytes):
    """Lists of parameters reduced together (as Horovod groups them, see
    :mod:`hora.common.gradient_policy`, or without ``groups`` in buckets of
    up to ``bucket_bytes``), and each list's name (None for a parameter
    reduced on its own)."""
    if groups is None:
        units = bucket_units([p.numel() * p.element_size() for p in params],
                             [(p.dtype, p.device) for p in params], bucket_bytes)
        units = [[params[i] for i in unit] for unit in units]
        return units, [_bucket_name(u, names) if len(u) > 1 else None for u in units]
    if not isinstance(groups, int):
        # as Horovod: every entry a tensor; those that are not parameters of
        # the optimizer that require grad (frozen ones, another model's) are
        # left out
        position = {id(p) for p in params}
        for k, group in enumerate(groups):
            if any(not isinstance(p, torch.Tensor) for p in group):
                raise ValueError(f"groups must consist of torch.Tensor. ({what}: groups[{k}] "
                                 f"holds something else)")
        groups = [[p for p in group if id(p) in position] for group in groups]
    units = group_units([id(p) for p in params], groups)
    # every unit of an int split is a group; of lists, the listed ones only
    grouped = len(units) if isinstance(groups, int) else sum(1 for g in groups if g)
    names = [f"DistributedOptimizer.group.{k}" if k < grouped else None
             for k in range(len(units))]
    return [[params[i] for i in unit] for unit in units], names


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: type[Compressor] = Compression.none,
                         backward_passes_per_step: int = 1, op: ReduceOp | int = ReduceOp.Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: int | list[list[torch.Tensor]] | None = None,
                         sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set, *,
                         bucket_bytes: int | None = None,
                         sharding: str | None = None,
                         replica_process_set: ProcessSet | None = None,
                         model: torch.nn.Module | None = None,
                         local_steps: int = 1,
                         outer_optimizer: Any = None) -> torch.optim.Optimizer:
    """Wraps ``optimizer`` so that ``step()`` applies gradients reduced over
    all ranks (averaged by default).

    Returns an instance of a subclass of ``type(optimizer)`` that shares its
    parameter groups, state and defaults. Gradients are reduced as autograd
    produces them; ``step()`` waits for the reductions and then updates.

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        named_parameters: ``(name, parameter)`` pairs naming every optimized
            parameter, usually ``model.named_parameters()``; default None
            names parameters by their position (fine when every rank builds
            the same optimizer, but two optimizers reducing at the same time
            need distinct names).
        compression: ``Compression.none`` (default), ``Compression.fp16`` or
            ``Compression.bf16``: the dtype gradients travel in.
        backward_passes_per_step: backward passes accumulated locally (the
            gradients are summed, as autograd does) before the reduction;
            default 1. Scale the loss by ``1 / backward_passes_per_step`` to
            average them instead.
        op: ``Average`` (default), ``Sum`` or ``Adasum``. With Adasum (on
            more than one rank of the set) each rank's optimizer steps on its
            own gradients and the steps are combined with Adasum, as in
            Horovod (see :mod:`hora.torch.adasum_optimizer`); the number of
            ranks must be a power of two.
        gradient_predivide_factor: with Average, gradients are divided by
            this factor before the sum and by ``size() / factor`` after it
            (the process set's size with ``process_set``; default 1.0).
        num_groups: Horovod's older spelling of an int ``groups``; a
            non-zero value warns (``DeprecationWarning``) and is used when
            ``groups`` is None. It sits before ``groups`` so that positional
            arguments line up with Horovod's signature.
        groups: None or 0 (each gradient reduced separately), an int ``k``
            (the parameters, in the optimizer's order, split as Horovod does
            into ``k`` contiguous blocks reduced as fused units, the first
            ``len % k`` one parameter longer), or a list of lists of
            parameters (each list one unit; parameters not listed are
            reduced separately).
        sparse_as_dense: reduce sparse gradients as dense tensors (default
            False: they are reduced by gathering indices and values).
        process_set: the :class:`hora.ProcessSet` whose ranks the gradients
            are reduced among (default ``global_process_set``: all ranks);
            Average divides by the set's size. Every rank may wrap its
            optimizer with the same set: on ranks outside it nothing is
            reduced and ``step()`` applies the local gradients (Horovod's).
            Two sets may use the same parameter names at the same time.
        bucket_bytes: (hora's, keyword only) without ``groups``, gradients
            are handed over in buckets of up to this many bytes, walking the
            parameters from last to first (the order backward produces
            them; the first bucket at most 1 MiB), each bucket one grouped
            allreduce started when its last gradient is ready. Default:
            ``HORA_GRADIENT_BUCKET_BYTES`` (25 MiB). 0 reduces each gradient
            on its own under ``allreduce.<parameter name>``, as Horovod
            does. The averaged gradients are the same either way. With
            ``sharding`` the default is at most 4 MiB: every bucket in
            flight is memory on top of the shards.
        sharding: (hora's, keyword only) None (default): every rank holds
            the whole training state, as in Horovod. ``"optimizer_state"``
            (ZeRO stage 1): each rank keeps the optimizer state of 1/N of
            every bucket of parameters; gradients are reduce-scattered and
            the updated parameters allgathered. ``"gradients"`` (stage 2):
            also only 1/N of the reduced gradients is kept. ``"parameters"``
            (stage 3): the parameters too live as 1/N shards, gathered
            around each block's forward and backward; it needs ``model``,
            wrapping sets every rank's parameters to the first rank's, and
            outside forward and backward the parameters are whole only
            inside ``optimizer.gathered_parameters()``. With sharding, wrapping
            is collective (the ranks of the process set check that they hold
            the same parameters), ``state_dict()`` is collective, ``p.grad``
            is not the averaged gradient after ``synchronize()`` (clip with
            the optimizer's ``clip_grad_norm_``), and the optimizer must
            update each element on its own (SGD, Adam, AdamW, RMSprop,
            Adagrad, ...; ``ValueError`` otherwise). See ``docs/sharding.md``.
        replica_process_set: (hora's, keyword only, with ``sharding``)
            hybrid sharding, as FSDP's HYBRID_SHARD: the state is sharded
            among the ranks of ``process_set`` and each shard is replicated
            on the ranks of this set, one per copy of ``process_set``
            (e.g. ``process_set`` the ranks of this host, this set the ranks
            with the same local rank on the other hosts); the reduced
            shards are averaged across it, so the gradients are averaged
            over every rank of both.
        model: (hora's, keyword only, with ``sharding="parameters"``) the
            ``torch.nn.Module`` whose parameters the optimizer holds: its
            blocks (the children of its ``ModuleList``, ``Sequential`` and
            ``ModuleDict`` containers, else its own children) get hooks that
            gather their parameters before forward and backward and free
            them after; every other parameter is gathered for the whole
            forward of ``model``.

    local_steps (hora's, keyword only): with ``H > 1``, local SGD: each
    rank steps on its own gradients (none is reduced) and the parameters
    are averaged over the ranks after every ``H`` steps
    (:mod:`hora.torch.local_sgd`). ``outer_optimizer``, a function making
    a ``torch.optim.Optimizer`` over the tensors it is given, applies each
    average as DiLoCo does (for example ``lambda ps: torch.optim.SGD(ps,
    lr=0.7, momentum=0.9, nesterov=True)``).

    Parameters whose gradient is never produced on some rank are reduced
    with zeros there, so no rank hangs. Raises ``TypeError`` when
    ``optimizer`` is not a torch optimizer, ``ValueError`` for duplicate,
    malformed or missing ``named_parameters`` entries, an op other than
    Average, Sum or Adasum (or Adasum on a number of ranks that is not a power of
    two), ``gradient_predivide_factor`` not
    1.0 with Sum or not positive, bad ``groups`` or
    ``backward_passes_per_step``, an optimizer that is already wrapped, or a
    process set that is not registered (``TypeError`` for something that is
    not a process set).
    """
    what = "DistributedOptimizer"
    set_id(process_set, what)
    process_set = set_object(process_set)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, (_DistributedOptimizer, _DistributedAdasumOptimizer,
                              _ShardedOptimizer, _LocalSGDOptimizer)):
        raise ValueError("this optimizer is already a hora DistributedOptimizer")
    stage = check_sharding(sharding)
    check_model(model, stage)
    policy = gradient_policy(what, op, gradient_predivide_factor, groups, num_groups,
                             compression, stacklevel=2)
    if stage:
        check_elementwise(optimizer, sharding)
        if policy.op == Adasum:
            raise ValueError(f"DistributedOptimizer: op=Adasum cannot be combined with "
                             f"sharding={sharding!r} (Adasum combines whole updates)")
        if policy.groups is not None:
            raise ValueError(f"DistributedOptimizer: groups/num_groups cannot be combined with "
                             f"sharding={sharding!r}; sharding packs gradients into its own "
                             f"buckets (set their size with bucket_bytes)")
    passes = check_backward_passes(backward_passes_per_step, what)
    names = _parameter_names(optimizer, named_parameters)
    if (isinstance(local_steps, bool) or not isinstance(local_steps, int)
            or local_steps < 1):
        raise ValueError(f"DistributedOptimizer: local_steps must be an int >= 1, got "
                         f"{local_steps!r}")
    if outer_optimizer is not None and local_steps == 1:
        raise ValueError("DistributedOptimizer: outer_optimizer applies local SGD's averages; "
                         "pass local_steps > 1 too")
    if outer_optimizer is not None and not callable(outer_optimizer):
        raise TypeError(f"DistributedOptimizer: outer_optimizer must be a function making an "
                        f"optimizer over the tensors it is given, got {outer_optimizer!r}")
    if local_steps > 1:
        return _local_sgd_optimizer(optimizer, names, local_steps, outer_optimizer, policy,
                                    sharding, process_set)
    if getattr(policy.compression, "stateful", False):
        policy.compression.check(names, policy.op, sharding)
    for p in names:
        if p.requires_grad and not p.is_leaf:
            raise ValueError("DistributedOptimizer: the optimizer holds a non-leaf tensor")
        if p.device.type not in ("cpu", "cuda"):
            raise ValueError(f"DistributedOptimizer: a parameter is on device '{p.device}'; "
                             f"hora.torch handles CPU and CUDA tensors")
    seen = set()
    params = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p not in seen:
                seen.add(p)
                params.append(p)
    if bucket_bytes is None:
        bucket_bytes = _C.gradient_bucket_bytes()
        if stage:
            # what a bucket in flight costs on top of the shards
            bucket_bytes = min(bucket_bytes, SHARDED_BUCKET_BYTES)
    elif isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
        raise ValueError(f"DistributedOptimizer: bucket_bytes must be an int >= 0, got "
                         f"{bucket_bytes!r}")
    hora_names = {p: f"allreduce.{name}" for p, name in names.items()}
    model_units = None
    if stage == 3:
        units, model_units = _model_buckets(model, params, names, bucket_bytes)
    else:
        units, unit_names = _split_units(params, policy.groups, what, names, bucket_bytes)

    if replica_process_set is not None and not stage:
        raise ValueError("DistributedOptimizer: replica_process_set is for hybrid sharding; "
                         "pass sharding= too")
    if stage:
        return _sharded_optimizer(optimizer, names, params, units, stage, policy, passes,
                                  sparse_as_dense, process_set, replica_process_set,
                                  model_units)
    member = process_set is global_process_set or bool(process_set.included())
    if policy.op == Adasum and member and set_size(process_set) > 1:
        return _adasum_optimizer(optimizer, names, policy, passes, process_set)
    wrapped = _rewrap(optimizer, _DistributedOptimizer, _CLASSES, names, process_set)
    wrapped._hora_setup(hora_names, units, unit_names, policy.groups is None, policy, passes,
                        sparse_as_dense, process_set)
    # Horovod's public attributes (read only: changing them changes nothing)
    wrapped.op = policy.op
    wrapped.gradient_predivide_factor = gradient_predivide_factor
    wrapped.sparse_as_dense = sparse_as_dense
    return wrapped


_ADASUM_CLASSES: dict[type, type] = {}
_SHARDED_CLASSES: dict[type, type] = {}


def _rewrap(optimizer, mixin, classes, names, process_set):
    """An instance of ``type(optimizer)`` with ``mixin`` in front (the class
    made once per optimizer class and kept in ``classes``), sharing
    ``optimizer``'s state; its hora state is set up by the caller."""
    base = type(optimizer)
    cls = classes.get(base)
    if cls is None:
        cls = type(base.__name__, (mixin, base),
                   {"__module__": base.__module__, "__qualname__": base.__qualname__})
        classes[base] = cls
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._parameter_names = names
    wrapped.process_set = process_set  # Horovod's attribute
    return wrapped


def _local_sgd_optimizer(optimizer, names, local_steps, outer_optimizer, policy, sharding,
                         process_set):
    """Local SGD (see :mod:`hora.torch.local_sgd`)."""
    what = f"DistributedOptimizer: local_steps={local_steps}"
    if sharding:
        raise ValueError(f"{what} cannot be combined with sharding={sharding!r} (every rank "
                         f"steps all of its parameters locally)")
    if policy.op != Average:
        raise ValueError(f"{what} averages parameters; op={ReduceOp(policy.op).name} does not "
                         f"apply")
    if policy.compression is not Compression.none:
        raise ValueError(f"{what} reduces no gradients, so compression={policy.compression!r} "
                         f"does not apply")
    if policy.groups is not None:
        raise ValueError(f"{what} reduces no gradients, so groups do not apply")
    params = list({id(p): p for group in optimizer.param_groups for p in group["params"]
                   if p.requires_grad}.values())
    member = process_set is global_process_set or bool(process_set.included())
    wrapped = _rewrap(optimizer, _LocalSGDOptimizer, _LOCAL_CLASSES, names, process_set)
    wrapped._hora_local_setup(params, local_steps, outer_optimizer, process_set, member)
    return wrapped


_LOCAL_CLASSES: dict[type, type] = {}


def _adasum_optimizer(optimizer, names, policy, passes, process_set):
    """Horovod's delta optimizer (see :mod:`hora.torch.adasum_optimizer`)."""
    size = set_size(process_set)
    if size & (size - 1):
        raise ValueError(f"DistributedOptimizer: op=Adasum needs a number of ranks that is a "
                         f"power of two, got {size} ranks")
    if any(p.grad is not None and p.grad.is_sparse for p in names):
        raise ValueError("DistributedOptimizer: op=Adasum does not take sparse gradients")
    wrapped = _rewrap(optimizer, _DistributedAdasumOptimizer, _ADASUM_CLASSES, names,
                      process_set)
    wrapped._hora_adasum_setup(type(optimizer), {p: f"adasum.{name}" for p, name in names.items()},
                               policy.compression, passes, process_set)
    return wrapped


def _model_buckets(model, params, names, bucket_bytes):
    """Stage 3: the buckets (lists of parameters), cut inside each unit of
    the model so that a block's parameters are gathered together, and
    (model, each unit's bucket indices, each unit's module)."""
    found = find_units(model, params, names)
    units, unit_buckets, modules = [], [], []
    # the buckets in the order backward produces gradients: last unit first
    for module, positions in reversed(found):
        members = [params[i] for i in sorted(positions)]
        cut = bucket_units([p.numel() * p.element_size() for p in members],
                           [(p.dtype, p.device) for p in members], bucket_bytes)
        unit_buckets.append(list(range(len(units), len(units) + len(cut))))
        modules.append(module)
        units.extend([members[i] for i in bucket] for bucket in cut)
    return units, (model, unit_buckets, modules)


def _sharded_optimizer(optimizer, names, params, units, stage, policy, passes, sparse_as_dense,
                       process_set, replicas, model_units):
    """ZeRO stages 1, 2 and 3 (see :mod:`hora.torch.sharded_optimizer`)."""
    member = process_set is global_process_set or bool(process_set.included())
    if replicas is not None:
        set_id(replicas, "DistributedOptimizer replica_process_set")
        if member and not replicas.included():
            raise ValueError(f"DistributedOptimizer: this rank is in process_set but not in "
                             f"replica_process_set {replicas}; every rank of a sharded set "
                             f"needs the set of its replicas")
    if member and not _C.joining():
        # (a process joining an elastic world in place checks nothing yet:
        # it takes the world's state when it joins)
        check_same_parameters(params, names, process_set)
    wrapped = _rewrap(optimizer, _ShardedOptimizer, _SHARDED_CLASSES, names, process_set)
    position = {p: i for i, p in enumerate(params)}
    wrapped._hora_shard_setup(params, names, [[position[p] for p in unit] for unit in units],
                              stage, policy, passes, sparse_as_dense, process_set,
                              replicas if member else None, model_units)
    if member and replicas is not None:
        check_replicas(wrapped._hora_layout, wrapped._hora_rank, process_set, replicas)
    return wrapped


def _local_step(optimizer: torch.optim.Optimizer) -> Any:
    """Runs the wrapped optimizer's own update, without any reduction."""
    if isinstance(optimizer, _DistributedOptimizer):
        return super(_DistributedOptimizer, optimizer).step()
    if isinstance(optimizer, _ShardedOptimizer):
        with optimizer._hora_pieces_as_params():
            return super(_ShardedOptimizer, optimizer).step()
    if isinstance(optimizer, _LocalSGDOptimizer):
        return optimizer._hora_own_step()
    return type(optimizer).step(optimizer)
