"""``import hora.tensorflow as hvd``: Horovod's TensorFlow 2 API over hora.

Pure Python over the core (no C++ built against TensorFlow), so one install
works with any TensorFlow 2 release. Collectives work eagerly and inside
``tf.function``, over all ranks or (``process_set=``) the ranks of a
:class:`ProcessSet`; ``DistributedGradientTape`` wraps a ``tf.GradientTape``;
``hora.tensorflow.keras`` (also ``hora.keras``) wraps Keras optimizers and
provides the callbacks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hora.common.basics import (
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, build_info, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_homogeneous,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rank, rocm_built, shutdown, size, start_timeline, stop_timeline)
from hora.common.exceptions import (
    HoraError, HoraInternalError, HoraInvalidArgumentError, HoraMismatchError, HoraShutdownError,
    HoraTimeoutError, HoraTypeError, HorovodInternalError, HostsUpdatedInterrupt)
from hora.tensorflow import elastic
from hora.tensorflow.compression import Compression
from hora.tensorflow.functions import (
    BroadcastGlobalVariablesHook, allgather_object, broadcast_global_variables, broadcast_object,
    broadcast_object_fn, check_num_rank_power_of_2, handle_average_backwards_compatibility)
from hora.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from hora.tensorflow.mpi_ops import (
    ProcessSet, add_process_set, allgather, allreduce, alltoall, barrier, broadcast, broadcast_,
    broadcast_variables, global_process_set, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, join, local_rank_op, local_size_op, process_set_included_op, rank_op,
    reducescatter, remove_process_set, size_op)

if TYPE_CHECKING:
    import keras

__all__ = [
    "Adasum", "Average", "BroadcastGlobalVariablesHook", "Compression", "DistributedGradientTape",
    "DistributedOptimizer", "PartialDistributedGradientTape", "broadcast_global_variables",
    "broadcast_object_fn", "check_num_rank_power_of_2", "handle_average_backwards_compatibility",
    "HoraError", "HoraInternalError", "HoraInvalidArgumentError", "HoraMismatchError",
    "HoraShutdownError", "HoraTimeoutError", "HoraTypeError",
    "HorovodInternalError", "HostsUpdatedInterrupt", "Max", "Min", "ProcessSet", "Product",
    "ReduceOp", "Sum", "SyncBatchNormalization", "add_process_set",
    "allgather", "allgather_object", "allreduce", "alltoall", "barrier", "broadcast", "broadcast_",
    "broadcast_object", "broadcast_variables", "build_info", "ccl_built", "cross_rank",
    "cross_size", "cuda_built", "ddl_built", "elastic", "global_process_set", "gloo_built",
    "gloo_enabled", "grouped_allgather", "grouped_allreduce", "grouped_reducescatter", "init",
    "is_homogeneous", "is_initialized", "join", "local_rank", "local_rank_op", "local_size",
    "local_size_op", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "process_set_included_op", "rank", "rank_op", "reducescatter", "remove_process_set",
    "rocm_built", "shutdown", "size", "size_op", "start_timeline",
    "stop_timeline"]


def __getattr__(name: str) -> Any:
    # SyncBatchNormalization is a Keras layer; Keras is imported when it is used
    if name == "SyncBatchNormalization":
        from hora.tensorflow.sync_batch_norm import SyncBatchNormalization
        return SyncBatchNormalization
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, *args: Any,
                         **kwargs: Any) -> keras.optimizers.Optimizer:
    """Horovod's TF2 spelling: wraps a Keras optimizer exactly as
    :func:`hora.tensorflow.keras.DistributedOptimizer` does."""
    from hora.tensorflow.keras import DistributedOptimizer as keras_optimizer
    return keras_optimizer(optimizer, *args, **kwargs)
