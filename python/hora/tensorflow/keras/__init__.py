"""``import hora.tensorflow.keras as hvd`` (or ``hora.keras``): Horovod's
Keras API for the Keras 3 that TensorFlow 2.16+ ships: ``DistributedOptimizer``,
the callbacks, ``load_model`` and the runtime functions."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import keras

from hora.common.basics import (
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, cross_rank, cross_size, init,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rank, shutdown, size, start_timeline, stop_timeline)
from hora.common.compression import Compressor
from hora.common.exceptions import HoraError, HoraMismatchError
from hora.tensorflow.compression import Compression
from hora.tensorflow.functions import allgather_object, broadcast_object
from hora.tensorflow.keras import callbacks, elastic
from hora.tensorflow.keras.optimizer import DistributedOptimizer, distributed_class
from hora.tensorflow.mpi_ops import allgather, allreduce, broadcast, join

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "HoraError", "HoraMismatchError",
    "Max", "Min", "Product", "ReduceOp", "Sum", "allgather", "allgather_object", "allreduce",
    "broadcast", "broadcast_object", "callbacks", "cross_rank", "cross_size", "elastic", "init",
    "is_initialized", "join", "load_model", "local_rank", "local_size", "mpi_built", "mpi_enabled",
    "mpi_threads_supported", "nccl_built", "rank", "shutdown", "size", "start_timeline",
    "stop_timeline"]


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
