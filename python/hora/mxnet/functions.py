"""Object collectives with Horovod's MXNet signatures."""

from __future__ import annotations

from typing import Any

from hora.common import ops
from hora.common.arguments import check_process_set, check_root


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: None = None) -> Any:
    """Returns ``root_rank``'s picklable ``obj`` on every rank."""
    check_process_set(process_set, "broadcast_object")
    return ops.broadcast_object(obj, check_root(root_rank, "broadcast_object"), name)


def allgather_object(obj: Any, name: str | None = None, process_set: None = None) -> list[Any]:
    """Returns the list of every rank's picklable ``obj``, in rank order."""
    check_process_set(process_set, "allgather_object")
    return ops.allgather_object(obj, name)
