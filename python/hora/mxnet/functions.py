"""Object collectives with Horovod's MXNet signatures."""

from hora.common import ops
from hora.common.arguments import check_process_set, check_root


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns ``root_rank``'s picklable ``obj`` on every rank."""
    check_process_set(process_set, "broadcast_object")
    return ops.broadcast_object(obj, check_root(root_rank, "broadcast_object"), name)


def allgather_object(obj, name=None, process_set=None):
    """Returns the list of every rank's picklable ``obj``, in rank order."""
    check_process_set(process_set, "allgather_object")
    return ops.allgather_object(obj, name)
