"""Object collectives with Horovod's TensorFlow signatures."""

from hora.common import ops as _ops
from hora.common.arguments import check_process_set, check_root


def broadcast_object(obj, root_rank=0, session=None, name=None, process_set=None):
    """Returns ``root_rank``'s picklable ``obj`` on every rank (``session``
    is accepted for Horovod compatibility and ignored)."""
    check_process_set(process_set, "broadcast_object")
    return _ops.broadcast_object(obj, check_root(root_rank, "broadcast_object"), name)


def allgather_object(obj, session=None, name=None, process_set=None):
    """Returns the list of every rank's picklable ``obj``, in rank order."""
    check_process_set(process_set, "allgather_object")
    return _ops.allgather_object(obj, name)
