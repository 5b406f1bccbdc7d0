"""Argument checks shared by the framework adapters (torch, tensorflow,
mxnet), so that every adapter words the same mistake the same way."""

import warnings

from hora.common import ops as _ops
from hora.common.basics import Average, ReduceOp, Sum


def check_process_set(process_set, what):
    """hora has one process set, the whole job; Horovod code passing the
    global set (``None`` here) keeps working, anything else is refused."""
    if process_set is not None:
        raise ValueError(
            f"{what}: hora has no process sets; every collective spans all ranks, so leave "
            f"process_set at its default (None / global_process_set)")


def check_op(op):
    """``op`` as a ReduceOp; ``ValueError`` for an unknown one."""
    return ReduceOp(_ops._check_op(op))


def resolve_op(average, op, what):
    """The reduction from Horovod's ``op`` and deprecated ``average``
    arguments; Average when neither is given."""
    if average is None and type(op) is ReduceOp:
        return op  # the common spelling, op=hvd.Sum: nothing to convert
    if op is not None and average is not None:
        raise ValueError(f"{what}: pass either op or the deprecated average argument, not both")
    if average is not None:
        warnings.warn(f"{what}: the average argument is deprecated; use op=Average or op=Sum",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    if op is None:
        return Average
    return check_op(op)


def check_root(root_rank, what):
    """``root_rank`` as an int; ``TypeError`` when it is not one."""
    try:
        return int(root_rank)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: root_rank must be an int, got {root_rank!r}") from None


def check_splits(values, what):
    """A list of ints from ``values`` (already flattened to Python numbers)."""
    result = []
    for s in values:
        if isinstance(s, bool) or int(s) != s:
            raise TypeError(f"{what}: splits must hold integers, got {s!r}")
        result.append(int(s))
    return result
