"""Argument checks shared by the NumPy face and the framework adapters
(torch, tensorflow, mxnet), so that every adapter words the same mistake
the same way."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from hora.common.reduce_op import Average, ReduceOp, Sum
from hora.common.exceptions import HoraTypeError

# ReduceOp members hash and compare like their values, so one lookup takes
# both (an enum construction costs as much as the rest of a submission).
_OP_VALUES = {int(o): int(o) for o in ReduceOp}


def op_value(op: ReduceOp | int) -> int:
    """``op`` as the int the core takes; ``ValueError`` for an unknown one."""
    value = _OP_VALUES.get(op) if isinstance(op, int) else None
    if value is None:
        raise ValueError(f"unknown reduce op {op!r}; use hora.Sum, Average, Min, Max or Product")
    return value


def check_process_set(process_set: object, what: str) -> None:
    """hora has one process set, the whole job; Horovod code passing the
    global set (``None`` here) keeps working, anything else is refused."""
    if process_set is not None:
        raise ValueError(
            f"{what}: hora has no process sets; every collective spans all ranks, so leave "
            f"process_set at its default (None / global_process_set)")


def check_op(op: ReduceOp | int) -> ReduceOp:
    """``op`` as a ReduceOp; ``ValueError`` for an unknown one."""
    return ReduceOp(op_value(op))


def resolve_op(average: bool | None, op: ReduceOp | int | None, what: str) -> ReduceOp:
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


def check_root(root_rank: Any, what: str) -> int:
    """``root_rank`` as an int; ``TypeError`` when it is not one."""
    try:
        return int(root_rank)
    except (TypeError, ValueError):
        raise TypeError(f"{what}: root_rank must be an int, got {root_rank!r}") from None


def check_splits(values: Iterable[Any], what: str) -> list[int]:
    """A list of ints from ``values`` (already flattened to Python numbers)."""
    result = []
    for s in values:
        if isinstance(s, bool) or int(s) != s:
            raise HoraTypeError(f"{what}: splits must hold integers, got {s!r}")
        result.append(int(s))
    return result
