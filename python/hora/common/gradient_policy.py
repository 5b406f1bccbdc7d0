"""How gradients are combined across ranks, the same in every framework.

torch's and Keras's ``DistributedOptimizer``, TensorFlow's
``DistributedGradientTape`` and MXNet's ``DistributedOptimizer`` /
``DistributedTrainer`` check their arguments here, so that the same mistake
gets the same words everywhere, and split their gradients into groups here,
so that the same ``groups`` / ``num_groups`` groups the same gradients.

Grouping follows Horovod: an int ``groups = k`` splits the gradient list, in
order, into ``k`` contiguous blocks whose lengths differ by at most one, the
longer ones first; a list of lists makes each inner list one group and every
gradient not listed a group of its own, after the listed ones.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from hora.common._adapter.checks import check_op
from hora.common.basics import Adasum, Average, ReduceOp, Sum
from hora.common.compression import NoneCompressor

T = TypeVar("T")

#: None (each gradient on its own), a number of groups, or lists of the
#: framework's parameters / variables.
Groups = Union[None, int, Sequence[Sequence[Any]]]


def check_gradient_op(op: ReduceOp | int, what: str) -> ReduceOp:
    """``op`` as a ReduceOp when gradients can be combined with it: Average,
    Sum or Adasum. ``ValueError`` otherwise."""
    op = check_op(op)
    if op not in (Average, Sum, Adasum):
        raise ValueError(f"{what}: op must be Average, Sum or Adasum, got {op.name}")
    return op


def check_predivide_factor(factor: float, what: str) -> float:
    """``gradient_predivide_factor`` as a float; ``ValueError`` unless it is
    a positive number."""
    try:
        value = float(factor)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: gradient_predivide_factor must be a positive number, got "
                         f"{factor!r}") from None
    if not value > 0:  # also refuses NaN
        raise ValueError(f"{what}: gradient_predivide_factor must be positive, got {value}")
    return value


def scale_factors(op: ReduceOp, factor: float, what: str) -> tuple[float, float]:
    """``(prescale, postscale)`` for gradients combined with ``op`` (already
    checked) and ``gradient_predivide_factor``. With Average the core divides
    by size() after the postscale, so the gradients are divided by ``factor``
    before the sum and by ``size() / factor`` after it: users trade overflow
    against underflow. Any factor but 1.0 needs Average."""
    factor = check_predivide_factor(factor, what)
    if op != Average:
        if factor != 1.0:
            raise ValueError(f"{what}: gradient_predivide_factor is only supported with "
                             f"op=Average, got op={op.name}")
        return 1.0, 1.0
    return 1.0 / factor, factor


def check_backward_passes(passes: int, what: str) -> int:
    """``backward_passes_per_step``; ``ValueError`` unless it is an int >= 1."""
    if isinstance(passes, bool) or not isinstance(passes, numbers.Integral) or passes < 1:
        raise ValueError(f"{what}: backward_passes_per_step must be at least 1 (an int), got "
                         f"{passes!r}")
    return int(passes)


def check_compression(compression: Any, what: str) -> Any:
    """``compression`` when it has ``compress`` and ``decompress``;
    ``TypeError`` otherwise."""
    if not (callable(getattr(compression, "compress", None))
            and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"{what}: compression must be one of the framework's Compression "
                        f"members (Compression.none, Compression.fp16, ...) or a class with "
                        f"compress and decompress, got {compression!r}")
    return compression


def check_groups(groups: Any, what: str) -> Groups:
    """``groups`` in one form: None for no grouping (None or 0), an int
    number of groups, or a list of lists. ``ValueError`` for a negative
    number, something else, or an entry listed in two groups."""
    if groups is None:
        return None
    if isinstance(groups, numbers.Integral) and not isinstance(groups, bool):
        if groups < 0:
            raise ValueError(f"{what}: the number of groups must not be negative, got {groups}")
        return int(groups) or None
    if not isinstance(groups, (list, tuple)):
        raise ValueError(f"{what}: groups must be a number of groups or a list of lists of "
                         f"parameters / variables, got {type(groups).__name__}")
    lists, seen = [], set()
    for k, group in enumerate(groups):
        # a tensor is iterable too, but splitting one into rows is never meant
        if (isinstance(group, (str, bytes)) or hasattr(group, "shape")
                or not isinstance(group, Iterable)):
            raise ValueError(f"{what}: groups[{k}] must be a list of parameters / variables, "
                             f"got {type(group).__name__}")
        group = list(group)
        for entry in group:
            if id(entry) in seen:
                raise ValueError(f"{what}: groups[{k}] repeats an entry of an earlier group; "
                                 f"each parameter / variable may be in one group only")
            seen.add(id(entry))
        lists.append(group)
    return lists


def resolve_groups(groups: Any, num_groups: int, what: str, num_groups_deprecated: bool = True,
                   stacklevel: int = 1) -> Groups:
    """The grouping from Horovod's ``groups`` and ``num_groups``. Where
    ``num_groups`` is deprecated (torch, TensorFlow, Keras; not MXNet, whose
    only spelling it is) a non-zero value warns, and counts only when
    ``groups`` is None, as in Horovod. ``stacklevel`` is the warning's, as
    counted from the caller."""
    if num_groups is None:
        num_groups = 0
    if num_groups_deprecated and num_groups != 0:
        warnings.warn(f"{what}: num_groups is deprecated (as in Horovod); pass groups instead",
                      DeprecationWarning, stacklevel=stacklevel + 1)
    if groups is None:
        groups = num_groups
    elif (isinstance(groups, numbers.Integral) and not isinstance(groups, bool)
          and groups == 0):
        # Horovod's check (groups > 0); num_groups=0 means no groups
        raise ValueError(f"groups should be a non-negative integer or a list of list of "
                         f"parameters / variables. ({what}: groups=0; leave groups as None for "
                         f"no explicit groups)")
    return check_groups(groups, what)


def split_evenly(items: Sequence[T], count: int) -> list[list[T]]:
    """``items`` in order, in ``count`` contiguous blocks (fewer when there
    are fewer items): the first ``len(items) % count`` blocks hold one item
    more than the others. This is Horovod's ``split_list``, without the empty
    blocks it leaves when ``count`` exceeds the number of items."""
    count = min(count, len(items))
    if count <= 0:
        return []
    length, longer = divmod(len(items), count)
    blocks, start = [], 0
    for k in range(count):
        end = start + length + (1 if k < longer else 0)
        blocks.append(list(items[start:end]))
        start = end
    return blocks


def group_units(keys: Sequence[Hashable], groups: Groups) -> list[list[int]]:
    """Which gradients are reduced together: lists of positions into
    ``keys`` (one key per gradient, in the order the gradients are given;
    ``id()`` of its parameter / variable where ``groups`` lists those).
    Positions of a group are in increasing order; with a list of lists, the
    listed groups come first (in their order, empty ones left out), then
    every other gradient on its own."""
    positions = list(range(len(keys)))
    if groups is None:
        return [[i] for i in positions]
    if isinstance(groups, int):
        return split_evenly(positions, groups)
    where = {key: i for i, key in enumerate(keys)}
    units, listed = [], set()
    for group in groups:
        members = sorted(where[id(entry)] for entry in group if id(entry) in where)
        if members:
            units.append(members)
            listed.update(members)
    units.extend([i] for i in positions if i not in listed)
    return units


#: The first bucket's size (or ``bucket_bytes`` when smaller): the last
#: layers' gradients, ready first, go out while backward is still running.
FIRST_BUCKET_BYTES = 1 << 20


def bucket_units(nbytes: Sequence[int], kinds: Sequence[Hashable],
                 bucket_bytes: int) -> list[list[int]]:
    """The default grouping: positions into the gradient list (given in the
    model's order, ``nbytes`` and ``kinds`` one per gradient) packed into
    buckets, walking from the last gradient to the first, the order a
    backward pass produces them in. A bucket holds gradients of one kind
    (dtype and device) and at most ``bucket_bytes``; a larger gradient is a
    bucket of its own. The first bucket of each kind closes with the
    gradient that brings it to ``FIRST_BUCKET_BYTES`` (as DDP's first
    bucket does): a model's last layer, often its largest gradient (an
    output projection over a vocabulary), is ready first and goes out with
    it rather than waiting in the next bucket for the layers before it.
    Positions in a bucket are in that reversed order. The result depends
    on the list alone, so every rank with the same model gets the same
    buckets without communicating. ``bucket_bytes`` 0: one unit per
    gradient, as Horovod reduces them."""
    if bucket_bytes <= 0:
        return [[i] for i in range(len(nbytes))]
    units: list[list[int]] = []
    first_cap = min(bucket_bytes, FIRST_BUCKET_BYTES)
    # kind -> (members, bytes, whether it is the kind's first bucket)
    open_units: dict[Hashable, tuple[list[int], int, bool]] = {}
    for i in reversed(range(len(nbytes))):
        members, size, first = open_units.get(kinds[i], ([], 0, True))
        if members and size + nbytes[i] > bucket_bytes:
            units.append(members)
            members, size, first = [], 0, False
        members.append(i)
        size += nbytes[i]
        if first and size >= first_cap:
            units.append(members)
            members, size, first = [], 0, False
        open_units[kinds[i]] = (members, size, first)
    units.extend(members for members, _, _ in open_units.values() if members)
    return units


@dataclass(frozen=True)
class GradientPolicy:
    """The checked settings of a framework's gradient averaging."""

    op: ReduceOp
    prescale: float
    postscale: float
    groups: Groups
    compression: Any

    def units(self, keys: Sequence[Hashable]) -> list[list[int]]:
        """:func:`group_units` of ``keys`` under this policy's groups."""
        return group_units(keys, self.groups)


def gradient_policy(what: str, op: ReduceOp | int = Average,
                    gradient_predivide_factor: float = 1.0, groups: Any = None,
                    num_groups: int = 0, compression: Any = NoneCompressor,
                    num_groups_deprecated: bool = True, stacklevel: int = 1) -> GradientPolicy:
    """Checks a framework's gradient-averaging arguments (``what`` names the
    call in messages) and returns them as a :class:`GradientPolicy`.
    ``stacklevel`` is that of the ``num_groups`` deprecation warning, as
    counted from the caller."""
    op = check_gradient_op(op, what)
    prescale, postscale = scale_factors(op, gradient_predivide_factor, what)
    resolved = resolve_groups(groups, num_groups, what, num_groups_deprecated, stacklevel + 1)
    return GradientPolicy(op, prescale, postscale, resolved,
                          check_compression(compression, what))
