"""What ``DistributedOptimizer(..., sharding=...)`` checks before it
shards anything: the ``sharding=`` value, whether the wrapped optimizer can
step a slice of a parameter, and (collectively) whether the ranks hold the
same parameters and, for hybrid sharding, the same shard."""

from __future__ import annotations

from typing import Any

import torch

from hora.common.shard_layout import ShardLayout
from hora.common.ops import allgather_object
from hora.torch._collectives import global_process_set, set_object

STAGES = {"optimizer_state": 1, "gradients": 2, "parameters": 3}


# torch's optimizers whose update of an element reads only that element's
# parameter, gradient and state (and scalars): stepping a slice of a
# parameter gives exactly that slice of the whole parameter's update.
_ELEMENTWISE = {torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax,
                torch.optim.NAdam, torch.optim.RAdam, torch.optim.RMSprop, torch.optim.Rprop,
                torch.optim.Adagrad, torch.optim.Adadelta, torch.optim.ASGD}
# Why the others cannot; matched on class names so that optimizers from
# other packages (apex's FusedLAMB, timm's Lamb, ...) are named too.
_WHOLE_TENSOR = (
    ("lbfgs", "it keeps a history of whole flattened parameter and gradient vectors and "
              "re-evaluates the loss in step()"),
    ("adafactor", "it factors the second moment of a matrix into row and column statistics"),
    ("muon", "it orthogonalizes each whole weight matrix (Newton-Schulz iterations)"),
    ("lamb", "its trust ratio divides the norm of each whole parameter by the norm of its "
             "whole update"),
    ("lars", "its trust ratio divides the norm of each whole parameter by the norm of its "
             "whole gradient"),
    ("shampoo", "it preconditions each whole parameter with matrices of its dimensions"),
    ("soap", "it preconditions each whole parameter with matrices of its dimensions"),
    ("sparseadam", "it steps sparse gradients, and shards are dense slices"),
)
_declared: set[type] = set()


def declare_elementwise(optimizer_class: type) -> type:
    """Declares that ``optimizer_class`` updates every element of a parameter
    from that element's parameter, gradient and state alone, so that
    ``DistributedOptimizer(..., sharding=...)`` may step slices of
    parameters with it. torch's SGD, Adam, AdamW, Adamax, NAdam, RAdam,
    RMSprop, Rprop, Adagrad, Adadelta and ASGD (and their subclasses) need
    no declaration. Returns the class, so it also works as a decorator."""
    if not (isinstance(optimizer_class, type)
            and issubclass(optimizer_class, torch.optim.Optimizer)):
        raise TypeError(f"declare_elementwise takes a torch.optim.Optimizer subclass, got "
                        f"{optimizer_class!r}")
    _declared.add(optimizer_class)
    return optimizer_class


def check_elementwise(optimizer: torch.optim.Optimizer, sharding: str | None) -> None:
    """``ValueError`` naming ``optimizer``'s class unless its update is known
    to be elementwise (see :func:`declare_elementwise`)."""
    cls = type(optimizer)
    if any(issubclass(cls, declared) for declared in _declared):
        return
    # names first: a LAMB built on SGD's class is still a LAMB
    lowered = {c.__name__.lower() for c in cls.__mro__}
    for fragment, why in _WHOLE_TENSOR:
        if any(fragment in name for name in lowered):
            raise ValueError(
                f"DistributedOptimizer(sharding={sharding!r}): {cls.__name__} cannot step a "
                f"shard: {why}, and with sharding each rank holds only a slice of a parameter. "
                f"Use sharding=None (replicated) with this optimizer")
    if any(issubclass(cls, known) for known in _ELEMENTWISE):
        return
    raise ValueError(
        f"DistributedOptimizer(sharding={sharding!r}): hora cannot tell whether "
        f"{cls.__module__}.{cls.__name__} updates each element on its own, which stepping a "
        f"slice of a parameter needs. If it does (as SGD and Adam do), declare it with "
        f"hora.torch.declare_elementwise({cls.__name__}); if it uses whole tensors (norms, "
        f"matrix factors), use sharding=None")


def check_sharding(sharding: Any) -> int:
    """The stage a ``sharding=`` value names (0: None, replicated)."""
    if sharding is None:
        return 0
    if not isinstance(sharding, str) or sharding not in STAGES:
        raise ValueError(f"DistributedOptimizer: sharding must be None, 'optimizer_state', "
                         f"'gradients' or 'parameters', got {sharding!r}")
    return STAGES[sharding]


def check_model(model: Any, stage: int) -> None:
    """``model=`` goes with ``sharding="parameters"`` and only with it."""
    if stage == 3 and model is None:
        raise ValueError("DistributedOptimizer(sharding='parameters') needs the model: pass "
                         "model=<the torch.nn.Module being trained>, whose blocks get hooks "
                         "that gather their parameters before forward and backward")
    if stage == 3 and not isinstance(model, torch.nn.Module):
        raise TypeError(f"DistributedOptimizer: model must be a torch.nn.Module, got "
                        f"{type(model).__name__}")
    if stage != 3 and model is not None:
        raise ValueError("DistributedOptimizer: model= is for sharding='parameters' (stage 3), "
                         "whose parameters are gathered around each block; other settings "
                         "need no model")


def check_replicas(layout: ShardLayout, rank: int, process_set: Any, replicas: Any) -> None:
    """Collective over ``replicas``: its ranks must hold the same shard of
    the same layout (the same position in sets of the same size), else
    ``ValueError`` on each of them naming the ranks that differ."""
    mine = (rank, layout.size, layout.fingerprint())
    everyone = allgather_object(mine, name="DistributedOptimizer.sharding.replicas",
                                process_set=set_object(replicas))
    if any(theirs != everyone[0] for theirs in everyone):
        described = ", ".join(f"rank {r}: shard {s[0]} of {s[1]} (layout {s[2]})"
                              for r, s in zip(replicas.ranks, everyone))
        raise ValueError(
            f"DistributedOptimizer: the ranks of replica_process_set must hold the same shard "
            f"of the same parameters, each in a process_set of the same size; got {described}")


def check_same_parameters(params: list[torch.Tensor], names: dict[torch.Tensor, str],
                          process_set: Any) -> None:
    """Collective over ``process_set``: every rank must shard the same
    parameters (names, shapes, dtypes, in the same order), else every rank
    raises :class:`hora.HoraMismatchError` naming the first parameter that
    differs, the ranks and both values."""
    from hora.common.exceptions import HoraMismatchError
    mine = [(names[p], tuple(p.shape), str(p.dtype).replace("torch.", "")) for p in params]
    everyone = allgather_object(mine, name="DistributedOptimizer.sharding.parameters",
                                process_set=set_object(process_set))
    members = (list(range(len(everyone))) if process_set is global_process_set
               else list(process_set.ranks))
    reference = everyone[0]
    for rank, theirs in zip(members[1:], everyone[1:]):
        if theirs == reference:
            continue
        for i in range(max(len(theirs), len(reference))):
            ours = reference[i] if i < len(reference) else None
            other = theirs[i] if i < len(theirs) else None
            if ours != other:
                raise HoraMismatchError(
                    f"DistributedOptimizer(sharding=...): ranks hold different parameters; "
                    f"parameter {i} is {_describe(ours)} on rank {members[0]} but "
                    f"{_describe(other)} on rank {rank}")


def _describe(entry: Any) -> str:
    if entry is None:
        return "missing"
    name, shape, dtype = entry
    return f"'{name}' {dtype} {list(shape)}"
