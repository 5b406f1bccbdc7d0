"""Process sets: collectives among a subset of the job's ranks, as in Horovod.

A :class:`ProcessSet` names some ranks; collectives given
``process_set=that_set`` run among those ranks only (hybrid and model
parallelism: each gradient reduced among the replicas of its shard).
``root_rank`` arguments stay global ranks; ``ProcessSet.rank()`` is this
process's place in the set. Sets are made at ``init(process_sets=[...])``
or, with dynamic process sets enabled, by :func:`add_process_set` and
:func:`remove_process_set`, which every rank calls in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hora._loader import _C
from hora.common.exceptions import HoraInvalidArgumentError

__all__ = ["ProcessSet", "add_process_set", "global_process_set", "remove_process_set"]


def _is_mpi_comm(value: Any) -> bool:
    return hasattr(value, "Get_rank") and hasattr(value, "allgather")


class ProcessSet:
    """Ranks that run collectives together.

    ``ProcessSet([0, 2])`` (global ranks, in any order: they are sorted) or
    ``ProcessSet(mpi4py_comm)`` (the ranks of that communicator; only at
    ``init``). The set is usable once ``init`` or :func:`add_process_set`
    has registered it (``process_set_id`` is then set).
    """

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int] | Any):
        if _is_mpi_comm(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            return
        if not isinstance(ranks_or_comm, Iterable) or isinstance(ranks_or_comm, (str, bytes)):
            raise ValueError("ProcessSet takes a list of ranks or an mpi4py communicator, got "
                             f"{type(ranks_or_comm).__name__}")
        ranks = list(ranks_or_comm)
        if any(isinstance(r, bool) or not isinstance(r, int) for r in ranks):
            raise ValueError(f"ProcessSet({ranks!r}): ranks must be integers")
        repeated = sorted({r for r in ranks if ranks.count(r) > 1})
        if repeated:
            raise ValueError(f"ProcessSet({ranks!r}): rank{'s' if len(repeated) > 1 else ''} "
                             f"{', '.join(map(str, repeated))} listed more than once")
        negative = [r for r in ranks if r < 0]
        if negative:
            raise ValueError(f"ProcessSet({ranks!r}): ranks must not be negative, got {negative}")
        self.ranks = sorted(ranks)

    def size(self) -> int | None:
        """The number of ranks in the set, or None before it is registered."""
        if self.process_set_id is None:
            return None
        return len(_C.process_set_info(self.process_set_id)[0])

    def rank(self) -> int | None:
        """This process's rank within the set (its index in ``ranks``), or
        None before it is registered. Raises ``ValueError`` on a process that
        is not in the set."""
        if self.process_set_id is None:
            return None
        ranks, mine = _C.process_set_info(self.process_set_id)
        if mine < 0:
            raise ValueError(f"this process (rank {_C.rank()}) is not part of {self}")
        return mine

    def included(self) -> bool | None:
        """Whether this process is in the set (None while its ranks are
        unknown: a communicator-defined set before ``init``)."""
        if self.ranks is None:
            return None
        return _C.rank() in self.ranks

    def _key(self) -> tuple[Any, ...]:
        if self.process_set_id is not None:
            return ("id", self.process_set_id)
        if self.ranks is not None:
            return ("ranks", tuple(self.ranks))
        return ("comm", id(self.mpi_comm))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProcessSet):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        if self.ranks is None and self.mpi_comm is not None:
            return f"ProcessSet(process_set_id={self.process_set_id}, mpi_comm={self.mpi_comm})"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __str__ = __repr__


#: Every rank of the job; the default ``process_set`` of every collective.
global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def unregistered(process_set: ProcessSet, what: str) -> HoraInvalidArgumentError:
    """The error for a set used before ``init`` or :func:`add_process_set`
    registered it."""
    return HoraInvalidArgumentError(
        f"{what}: {process_set} is not registered; pass it to "
        f"hora.init(process_sets=[...]) or hora.add_process_set() first")


def _id(process_set: ProcessSet | None) -> int:
    """The id of a set (the adapters check the argument first; see
    hora.common._adapter.checks)."""
    if process_set is None:
        return 0
    if process_set.process_set_id is None:
        raise unregistered(process_set, "process_set")
    return process_set.process_set_id


def from_id(ident: int, what: str) -> ProcessSet:
    """The registered set with core id ``ident`` (the global set for 0), for
    code that carries sets by id (torch's compiled operators); -1 or an id
    the core does not know raise ``HoraInvalidArgumentError``."""
    if ident == 0:
        return global_process_set
    known = _C.process_sets() if ident > 0 else {}
    if ident not in known:
        raise HoraInvalidArgumentError(
            f"{what}: the process set is not registered; pass it to "
            f"hora.init(process_sets=[...]) or hora.add_process_set() first")
    process_set = ProcessSet(known[ident])
    process_set.process_set_id = ident
    return process_set


def set_size(process_set: ProcessSet | None) -> int:
    """The number of ranks a collective in ``process_set`` runs over."""
    ident = _id(process_set)
    return len(_C.process_set_info(ident)[0]) if ident else _C.size()


def set_rank(process_set: ProcessSet | None) -> int:
    """This process's rank within ``process_set`` (global rank for the
    global set); -1 when it is not a member."""
    ident = _id(process_set)
    return _C.process_set_info(ident)[1] if ident else _C.rank()


def _register(process_set: ProcessSet) -> None:
    process_set.process_set_id = _C.add_process_set(list(process_set.ranks or ()))


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Registers a new process set and returns it; every rank calls it, in
    the same order, with the same ranks (needs ``init(process_sets="dynamic")``
    or ``HORA_DYNAMIC_PROCESS_SETS=1``). Raises ``ValueError`` for a set that
    exists already or bad ranks, :class:`~hora.HoraMismatchError` on every
    rank when the ranks differ between ranks."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError("add_process_set: sets defined by an MPI communicator can only "
                                  "be given to init(process_sets=[...]); pass a list of ranks")
    if not _C.dynamic_process_sets():
        raise ValueError("add_process_set needs dynamic process sets: call "
                         "hora.init(process_sets='dynamic') or set HORA_DYNAMIC_PROCESS_SETS=1")
    if process_set.process_set_id is not None:
        raise ValueError(f"add_process_set: {process_set} is registered already")
    _register(process_set)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a dynamically added set; every rank calls it in the same
    order. Returns False (as Horovod) for a set that is not registered;
    removing the global set raises ``ValueError``. Collectives of the set
    still waiting fail; the object is unregistered."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set takes a hora.ProcessSet, got "
                        f"{type(process_set).__name__}")
    if process_set is global_process_set or process_set.process_set_id == 0:
        raise ValueError("remove_process_set: the global process set cannot be removed")
    if not _C.dynamic_process_sets():
        raise ValueError("remove_process_set needs dynamic process sets: call "
                         "hora.init(process_sets='dynamic') or set HORA_DYNAMIC_PROCESS_SETS=1")
    ident = process_set.process_set_id
    if ident is None or ident not in _C.process_sets():
        return False
    _C.remove_process_set(ident)
    process_set.process_set_id = None
    return True
