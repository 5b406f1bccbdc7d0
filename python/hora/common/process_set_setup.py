"""Registers ``hora.init(process_sets=[...])``'s sets on a freshly started
job (apart from process_sets.py, which the collectives import, because
collecting communicator-defined sets takes a collective itself)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hora._loader import _C
from hora.common.ops import allgather_object
from hora.common.process_sets import ProcessSet, _register, global_process_set


def _ranks_of_comm(comm: Any) -> list[int]:
    """The job ranks of an mpi4py communicator's members (collective over it)."""
    return sorted(int(r) for r in comm.allgather(_C.rank()))


def setup_at_init(process_sets: Sequence[ProcessSet]) -> None:
    """Registers ``init(process_sets=[...])``'s sets, in list order, on the
    freshly started job (collective over every rank). Sets given as rank
    lists must be the same on every rank (a difference raises
    :class:`~hora.HoraMismatchError` on every rank); communicator-defined
    sets are collected from every rank first, since each rank holds only
    the communicators it belongs to."""
    global_process_set.ranks = list(range(_C.size()))
    by_ranks = [(ps, ps.ranks) for ps in process_sets if ps.ranks is not None]
    by_comm = [(ps, _ranks_of_comm(ps.mpi_comm)) for ps in process_sets if ps.ranks is None]
    for ps, ranks in by_comm:
        ps.ranks = ranks
    if _C.size() > 1 or by_comm:
        everyone = allgather_object(sorted({tuple(ranks) for _, ranks in by_comm}),
                                    name="hora.process_sets.from_comms")
        comm_sets = sorted({ranks for mine in everyone for ranks in mine})
    else:
        comm_sets = []
    seen: dict[tuple[int, ...], ProcessSet] = {}
    size = _C.size()
    for ps, ranks in by_ranks:
        key = tuple(ranks)
        outside = [r for r in key if r >= size]
        if outside:  # the core's words (ranks are sorted and not negative)
            raise ValueError(f"init(process_sets=...): {ps}: rank {outside[0]} is outside the "
                             f"job's ranks 0..{size - 1}")
        if key in seen or key == tuple(range(size)):
            raise ValueError(f"init(process_sets=...): {ps} is a duplicate of "
                             f"{seen.get(key, global_process_set)}")
        _register(ps)
        seen[key] = ps
    ids = {}
    for ranks in comm_sets:
        if ranks in seen:
            ids[ranks] = seen[ranks].process_set_id
            continue
        ids[ranks] = _C.add_process_set(list(ranks))
    for ps, ranks in by_comm:
        ps.process_set_id = ids[tuple(ranks)]
