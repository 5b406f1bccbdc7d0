"""``import hora.tensorflow.keras as hvd`` (or ``hora.keras``): Horovod's
Keras API for the Keras that ``tf.keras`` is: Keras 3 by default on
TensorFlow 2.16+, Keras 2 (``tf_keras``) with ``TF_USE_LEGACY_KERAS=1``.
``DistributedOptimizer`` (``process_set=`` reduces among a process set's
ranks), the callbacks, ``load_model`` and the runtime functions."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from hora.common.basics import (
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, ccl_built, cross_rank, cross_size,
    cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_initialized, local_rank, local_size,
    mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size,
    start_timeline, stop_timeline)
from hora.common.compression import Compressor
from hora.common.exceptions import HoraError, HoraMismatchError
from hora.tensorflow import mpi_ops as _tf_ops
from hora.tensorflow.compression import Compression
from hora.tensorflow.functions import (
    allgather_object, broadcast_global_variables, broadcast_object)
from hora.tensorflow.keras import callbacks, elastic
from hora.tensorflow.keras._flavor import keras
from hora.tensorflow.keras.optimizer import (
    DistributedOptimizer, PartialDistributedOptimizer, adopt)
from hora.tensorflow.mpi_ops import (
    ProcessSet, add_process_set, global_process_set, join, remove_process_set)

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HoraError", "HoraMismatchError",
    "Max", "Min", "PartialDistributedOptimizer", "ProcessSet", "Product", "ReduceOp", "Sum",
    "add_process_set", "allgather",
    "allgather_object", "allreduce", "broadcast", "broadcast_global_variables",
    "broadcast_object", "callbacks", "ccl_built", "cross_rank", "cross_size", "cuda_built",
    "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled", "init",
    "is_initialized", "join", "load_model", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "reducescatter",
    "remove_process_set", "rocm_built", "shutdown", "size", "start_timeline", "stop_timeline"]


# Horovod's Keras spellings: a value (anything tf.convert_to_tensor takes) and the
# collective's name as the second argument.

def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              op: ReduceOp | int | None = None,
              compression: type[Compressor] = Compression.none) -> tf.Tensor:
    """The reduction of ``value`` over all ranks (Average unless ``op``)."""
    return _tf_ops.allreduce(tf.convert_to_tensor(value), average=average,
                             compression=compression, op=op, prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, name=name)


def allgather(value: Any, name: str | None = None) -> tf.Tensor:
    """Every rank's ``value`` concatenated along the first dimension."""
    return _tf_ops.allgather(tf.convert_to_tensor(value), name=name)


def broadcast(value: Any, root_rank: int, name: str | None = None) -> tf.Tensor:
    """``root_rank``'s ``value`` on every rank."""
    return _tf_ops.broadcast(tf.convert_to_tensor(value), root_rank, name=name)


def reducescatter(value: Any, name: str | None = None,
                  op: ReduceOp | int = Average) -> tf.Tensor:
    """This rank's block of rows of the reduction of ``value``."""
    return _tf_ops.reducescatter(tf.convert_to_tensor(value), name=name, op=op)


def load_model(filepath: str | os.PathLike[str],
               custom_optimizers: Iterable[type] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: type[Compressor] = Compression.none, legacy_opts: bool = False,
               **kwargs: Any) -> Any:
    """Loads a Keras model saved with ``model.save`` (with or without hora)
    and makes its optimizer a :func:`DistributedOptimizer` (with
    ``compression``), keeping the optimizer state the file holds. Pass your
    own optimizer classes in ``custom_optimizers`` and other custom layers
    or losses in ``custom_objects``; ``kwargs`` go to
    ``keras.models.load_model``. ``legacy_opts`` is accepted for Horovod's
    signature: Keras 2's legacy optimizers are recognized either way."""
    objects = {cls.__name__: cls for cls in custom_optimizers or []}
    objects.update(custom_objects or {})
    model = keras.models.load_model(filepath, custom_objects=objects, **kwargs)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        adopt(optimizer, dict(compression=compression))
    return model
