"""Argument checks shared by the NumPy face and the framework adapters
(torch, tensorflow, mxnet): one function per mistake, so that every
adapter words the same mistake the same way and raises the same class.

- a ``process_set=`` that is not a :class:`hora.ProcessSet`:
  :class:`~hora.HoraTypeError` (a ``TypeError``, also a ``ValueError``);
  one that is not registered: :class:`~hora.HoraInvalidArgumentError` (a
  ``ValueError``, also a ``RuntimeError``);
- a dtype the core cannot reduce: :class:`~hora.HoraTypeError`, as the
  core raises for the NumPy face;
- an unknown reduce op, ``op`` and ``average`` both given: ``ValueError``
  (Horovod's class);
- a ``root_rank`` that is not an int: ``TypeError``; ``splits`` that are
  not integers: :class:`~hora.HoraTypeError`.

A process outside the set, or a root outside it, is refused by the core
(``hora._C``), in its words, for every adapter.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Iterable
from typing import Any

from hora.common.exceptions import HoraTypeError
from hora.common.process_sets import ProcessSet, global_process_set, unregistered
from hora.common.reduce_op import Average, ReduceOp, Sum

# ReduceOp members hash and compare like their values, so one lookup takes
# both (an enum construction costs as much as the rest of a submission).
_OP_VALUES = {int(o): int(o) for o in ReduceOp}


def op_value(op: ReduceOp | int) -> int:
    """``op`` as the int the core takes; ``ValueError`` for an unknown one."""
    value = _OP_VALUES.get(op) if isinstance(op, int) else None
    if value is None:
        raise ValueError(f"unknown reduce op {op!r}; use hora.Sum, Average, Min, Max or Product")
    return value


def process_set_id(process_set: ProcessSet | None, what: str = "process_set") -> int:
    """The core's id of a ``process_set=`` argument: 0 for the global set
    (one identity check on the per-gradient path), the registered id of
    another :class:`hora.ProcessSet`."""
    if process_set is global_process_set or process_set is None:
        return 0
    if not isinstance(process_set, ProcessSet):
        raise HoraTypeError(f"{what}: process_set must be one of hora's process sets (a "
                            f"hora.ProcessSet: global_process_set or one made by "
                            f"add_process_set), got {type(process_set).__name__}")
    if process_set.process_set_id is None:
        raise unregistered(process_set, what)
    return process_set.process_set_id


def process_set_object(process_set: ProcessSet | None, what: str) -> ProcessSet:
    """``process_set`` checked as :func:`process_set_id` does, with None
    spelled as the global set."""
    process_set_id(process_set, what)
    return global_process_set if process_set is None else process_set


def unsupported_dtype(what: str, dtype: str, supported: Iterable[str]) -> HoraTypeError:
    """The error for a tensor whose dtype the core cannot reduce."""
    return HoraTypeError(f"{what}: dtype {dtype} is not supported; supported dtypes are "
                         f"{', '.join(supported)}")


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
    """``root_rank`` as an int; ``TypeError`` when it is not an integer
    (1.5 or "1" included, which Horovod's binding refuses too, rather than
    a rank made of them)."""
    try:
        return operator.index(root_rank)
    except TypeError:
        raise TypeError(f"{what}: root_rank must be an int, got {root_rank!r}") from None


def check_splits(values: Iterable[Any], what: str) -> list[int]:
    """A list of ints from ``values`` (already flattened to Python numbers)."""
    result = []
    for s in values:
        if isinstance(s, bool) or int(s) != s:
            raise HoraTypeError(f"{what}: splits must hold integers, got {s!r}")
        result.append(int(s))
    return result
