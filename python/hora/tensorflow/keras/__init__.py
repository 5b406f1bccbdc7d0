"""``import hora.tensorflow.keras as hvd`` (or ``hora.keras``): Horovod's
Keras API for the Keras 3 that TensorFlow 2.16+ ships: ``DistributedOptimizer``,
the callbacks, ``load_model`` and the runtime functions."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import keras

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
from hora.tensorflow.keras.optimizer import (
    DistributedOptimizer, PartialDistributedOptimizer, distributed_class)
from hora.tensorflow.mpi_ops import global_process_set, join

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HoraError", "HoraMismatchError",
    "Max", "Min", "PartialDistributedOptimizer", "Product", "ReduceOp", "Sum", "allgather",
    "allgather_object", "allreduce", "broadcast", "broadcast_global_variables",
    "broadcast_object", "callbacks", "ccl_built", "cross_rank", "cross_size", "cuda_built",
    "ddl_built", "elastic", "global_process_set", "gloo_built", "gloo_enabled", "init",
    "is_initialized", "join", "load_model", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "reducescatter", "rocm_built",
    "shutdown", "size", "start_timeline", "stop_timeline"]


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
               custom_optimizers: Iterable[type[keras.optimizers.Optimizer]] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: type[Compressor] = Compression.none,
               **kwargs: Any) -> keras.Model:
    """Loads a Keras model saved with ``model.save`` and wraps its optimizer
    in :func:`DistributedOptimizer` (with ``compression``). Every optimizer
    class in ``keras.optimizers`` is recognized; pass your own optimizer
    classes in ``custom_optimizers`` and other custom layers or losses in
    ``custom_objects``. ``kwargs`` go to ``keras.models.load_model``."""
    settings = dict(compression=compression)
    classes = [getattr(keras.optimizers, name) for name in dir(keras.optimizers)]
    classes = [c for c in classes
               if isinstance(c, type) and issubclass(c, keras.optimizers.Optimizer)
               and c is not keras.optimizers.Optimizer]
    classes += list(custom_optimizers or [])
    objects = {cls.__name__: distributed_class(cls, settings) for cls in classes}
    objects.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=objects, **kwargs)
