"""Object collectives with Horovod's MXNet signatures."""

from __future__ import annotations

from typing import Any

from hora.common import ops
from hora.common._adapter.checks import check_root
from hora.common.process_sets import ProcessSet, global_process_set
from hora.mxnet._arrays import set_object


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``root_rank``'s picklable ``obj`` on every rank (of
    ``process_set``, whose members alone call it; ``root_rank`` is a global
    rank in the set)."""
    process_set = set_object(process_set, "broadcast_object")
    return ops.broadcast_object(obj, check_root(root_rank, "broadcast_object"), name,
                                process_set=process_set)


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Returns the list of every rank's picklable ``obj``, in rank order (the
    members of ``process_set``, in the set's order)."""
    return ops.allgather_object(obj, name,
                                process_set=set_object(process_set, "allgather_object"))
