"""How collectives are named. Ranks match a collective by its name, so a
user-given name is used as it is and an unnamed collective gets the next
name of its kind's counter: the same on every rank as long as every rank
makes its unnamed calls in the same order, as in Horovod."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import overload

_counter_lock = threading.Lock()
_counters: dict[str, Iterator[int]] = {}


def auto_name(kind: str, process_set: int = 0) -> str:
    """The next automatic name for an unnamed collective of ``kind``. Each
    process set counts on its own: only its members make its calls."""
    key = kind if process_set == 0 else f"{kind}@{process_set}"
    with _counter_lock:
        counter = _counters.setdefault(key, itertools.count())
        return f"{kind}.noname.{next(counter)}"


def restart_counters() -> None:
    """Every kind counts from 0 again: called on every rank of a world
    formed in place (hora.common.elastic), whose ranks may have made
    different numbers of unnamed calls before (a step a lost rank
    interrupted) or none at all (a process that joins)."""
    with _counter_lock:
        _counters.clear()


def check_name(name: str | None, kind: str, process_set: int = 0) -> str:
    """``name``, or an automatic one when it is None; ``TypeError`` for a
    name that is not a str."""
    if name is None:
        return auto_name(kind, process_set)
    if not isinstance(name, str):
        raise TypeError(f"{kind}: name must be a str, got {type(name).__name__}")
    return name


def group_names(name: str | None, count: int, kind: str, process_set: int = 0) -> list[str]:
    """Names of the ``count`` members of a grouped collective: one base
    name (``name`` or an automatic one) with the member's index appended."""
    base = check_name(name, kind, process_set)
    return [f"{base}.{i}" for i in range(count)]


class MemberNames(Sequence[str]):
    """The names of a grouped collective's members (``base.0``,
    ``base.1``, ...), made only when asked for: a packed submission names
    its chunk after the first member alone."""

    __slots__ = ("base", "size")

    def __init__(self, base: str, size: int):
        self.base = base
        self.size = size

    def __len__(self) -> int:
        return self.size

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [f"{self.base}.{i}" for i in range(self.size)[index]]
        if not -self.size <= index < self.size:
            raise IndexError(index)
        return f"{self.base}.{index % self.size}"


def member_names(name: str | None, count: int, kind: str, process_set: int = 0) -> MemberNames:
    """:func:`group_names` as a :class:`MemberNames`."""
    return MemberNames(check_name(name, kind, process_set), count)
