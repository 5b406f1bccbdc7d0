"""Object collectives with Horovod's TensorFlow signatures."""

from __future__ import annotations

from typing import Any

from hora.common import ops as _ops
from hora.common._adapter.checks import check_root
from hora.common.process_sets import ProcessSet, global_process_set


def _object_set(process_set: ProcessSet | None, what: str) -> ProcessSet:
    from hora.tensorflow.mpi_ops import _checked_set

    return _checked_set(process_set, what)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``root_rank``'s picklable ``obj`` on every rank (of
    ``process_set``; ``root_rank`` is a global rank in it). ``session`` is
    accepted for Horovod compatibility and ignored."""
    ps = _object_set(process_set, "broadcast_object")
    return _ops.broadcast_object(obj, check_root(root_rank, "broadcast_object"), name,
                                 process_set=ps)


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Returns the list of every rank's picklable ``obj``, in rank order (of
    the ranks of ``process_set``)."""
    ps = _object_set(process_set, "allgather_object")
    return _ops.allgather_object(obj, name, process_set=ps)


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Any:
    """Horovod's TF1 helper: a function ``fn(obj)`` returning ``root_rank``'s
    ``obj`` on every rank of ``process_set`` (it needs no session here)."""
    ps = _object_set(process_set, "broadcast_object_fn")
    root_rank = check_root(root_rank, "broadcast_object_fn")

    def broadcast(obj: Any) -> Any:
        return _ops.broadcast_object(obj, root_rank, name, process_set=ps)
    return broadcast




def broadcast_global_variables(root_rank: int) -> Any:
    """Horovod's TF1 helper: an op assigning ``root_rank``'s values to every
    ``tf.compat.v1.global_variables()`` of the graph. Eagerly there are no
    global variables: raises ``RuntimeError`` as Horovod does, pointing to
    ``broadcast_variables``."""
    import tensorflow as tf

    from hora.tensorflow.mpi_ops import broadcast_variables

    if tf.executing_eagerly():
        raise RuntimeError(
            "hvd.broadcast_global_variables() does not support eager execution. Please use "
            "`hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)


def _session_run_hook_base() -> type:
    import tensorflow as tf

    train = getattr(tf.compat.v1, "train", None)
    return getattr(train, "SessionRunHook", object)


# Made at import time; to a type checker, a class it knows nothing of.
_SessionRunHook: Any = _session_run_hook_base()


class BroadcastGlobalVariablesHook(_SessionRunHook):
    """Horovod's TF1 ``SessionRunHook``: once the session exists, assigns
    ``root_rank``'s values to every global variable, so that all ranks start
    alike (``tf.compat.v1.train.MonitoredTrainingSession(hooks=[...])``)."""

    def __init__(self, root_rank: int, device: str = "") -> None:
        super().__init__()
        self.root_rank = check_root(root_rank, "BroadcastGlobalVariablesHook")
        self.bcast_op = None
        self.device = device

    def begin(self) -> None:
        import tensorflow as tf

        graph = tf.compat.v1.get_default_graph()
        if self.bcast_op is None or self.bcast_op.graph is not graph:
            self.bcast_op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self.bcast_op is not None:
            session.run(self.bcast_op)
