"""``import hora.tensorflow as hvd``: Horovod's TensorFlow 2 API over hora.

Pure Python over the core (no C++ built against TensorFlow), so one install
works with any TensorFlow 2 release. Collectives work eagerly and inside
``tf.function``, over all ranks or (``process_set=``) the ranks of a
:class:`ProcessSet`; ``DistributedGradientTape`` wraps a ``tf.GradientTape``;
``hora.tensorflow.keras`` (also ``hora.keras``) wraps Keras optimizers and
provides the callbacks.
"""

from __future__ import annotations

from typing import Any

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
    broadcast_object_fn)
from hora.tensorflow.gradient_tape import DistributedGradientTape, PartialDistributedGradientTape
from hora.tensorflow.mpi_ops import (
    ProcessSet, add_process_set, allgather, allreduce, alltoall, barrier, broadcast, broadcast_,
    broadcast_variables, check_num_rank_power_of_2, global_process_set, grouped_allgather,
    grouped_allreduce, grouped_reducescatter, handle_average_backwards_compatibility, join,
    local_rank_op, local_size_op, process_set_included_op, rank_op,
    reducescatter, remove_process_set, size_op)

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


def DistributedOptimizer(optimizer: Any, name: str | None = None,
                         use_locking: bool = False, device_dense: str = "",
                         device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1,
                         op: ReduceOp | int = Average, gradient_predivide_factor: float = 1.0,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: Any = None, process_set: Any = global_process_set,
                         scale_local_gradients: bool = True, *,
                         sharding: str | None = None) -> Any:
    """Horovod's ``horovod.tensorflow.DistributedOptimizer``, with its
    parameters in its order. A TensorFlow 1 optimizer
    (``tf.compat.v1.train.Optimizer``) is wrapped as Horovod wraps it (see
    :mod:`hora.tensorflow.legacy_optimizer`; ``use_locking`` is passed to
    it); a Keras optimizer exactly as by
    :func:`hora.tensorflow.keras.DistributedOptimizer` (``use_locking`` has
    no effect there). ``sharding`` is hora's (only None: sharded training
    state is PyTorch-only)."""
    from hora.tensorflow.legacy_optimizer import LegacyOptimizer

    if op == Adasum and average_aggregated_gradients:
        raise ValueError("Adasum does not support average_aggregated_gradients == True")
    if isinstance(optimizer, LegacyOptimizer):
        return _legacy_optimizer(
            optimizer, name, use_locking, device_dense, device_sparse, compression,
            sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor,
            average_aggregated_gradients, num_groups, groups, process_set,
            scale_local_gradients, sharding)
    from hora.tensorflow.keras import DistributedOptimizer as keras_optimizer
    return keras_optimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, num_groups=num_groups,
        groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients,
        sharding=sharding)


def _legacy_optimizer(optimizer, name, use_locking, device_dense, device_sparse, compression,
                      sparse_as_dense, backward_passes_per_step, op, gradient_predivide_factor,
                      average_aggregated_gradients, num_groups, groups, process_set,
                      scale_local_gradients, sharding):
    from hora.common.gradient_policy import check_backward_passes, resolve_groups
    from hora.tensorflow.keras.optimizer import check_keras_sharding
    from hora.tensorflow.legacy_optimizer import _DistributedOptimizer

    what = f"DistributedOptimizer({type(optimizer).__name__})"
    check_keras_sharding(sharding)
    passes = check_backward_passes(backward_passes_per_step, what)
    # resolved here, so that the num_groups warning points at the caller
    resolved = resolve_groups(groups, num_groups, what, stacklevel=3)
    return _DistributedOptimizer(
        optimizer, name=name, use_locking=use_locking, device_dense=device_dense,
        device_sparse=device_sparse, compression=compression, sparse_as_dense=sparse_as_dense,
        op=op, gradient_predivide_factor=gradient_predivide_factor,
        backward_passes_per_step=passes,
        average_aggregated_gradients=average_aggregated_gradients, groups=resolved,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
