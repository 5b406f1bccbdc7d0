"""``import hora.mxnet as hvd``: Horovod's MXNet API over hora.

Pure Python over the core (nothing compiled against MXNet): collectives on
CPU ``mx.nd.NDArray``s, ``DistributedOptimizer`` for Module or hand-written
update loops, ``DistributedTrainer`` for gluon, ``broadcast_parameters``;
each takes ``process_set=`` to run among a subset of the ranks
(``ProcessSet``, ``add_process_set``, ``remove_process_set``,
``global_process_set``).
Tested with MXNet 1.9.1, which on Python 3.11 needs ``numpy<1.24``.
"""

from hora.common.basics import (
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, build_info, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_homogeneous,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rank, rocm_built, shutdown, size, start_timeline, stop_timeline)
from hora.common.exceptions import (
    HoraError, HoraInternalError, HoraInvalidArgumentError, HoraMismatchError, HoraShutdownError,
    HoraTimeoutError, HoraTypeError, HorovodInternalError)
from hora.mxnet.compression import Compression
from hora.mxnet.functions import allgather_object, broadcast_object
from hora.mxnet.mpi_ops import (
    ProcessSet, add_process_set, allgather, allreduce, allreduce_, alltoall, barrier, broadcast,
    broadcast_, global_process_set, grouped_allgather, grouped_allreduce, grouped_allreduce_,
    grouped_reducescatter, join, reducescatter, remove_process_set)
from hora.mxnet.training import DistributedOptimizer, DistributedTrainer, broadcast_parameters

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "DistributedTrainer", "HoraError",
    "HoraInternalError", "HoraInvalidArgumentError", "HoraMismatchError", "HoraShutdownError",
    "HoraTimeoutError", "HoraTypeError", "HorovodInternalError", "Max",
    "Min", "ProcessSet", "Product", "ReduceOp", "Sum", "add_process_set", "allgather",
    "allgather_object", "allreduce", "allreduce_",
    "alltoall", "barrier", "broadcast", "broadcast_", "broadcast_object", "broadcast_parameters",
    "build_info", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allreduce",
    "grouped_allreduce_", "grouped_reducescatter", "init", "is_homogeneous", "is_initialized",
    "join", "local_rank", "local_size", "mpi_built",
    "mpi_enabled", "mpi_threads_supported", "nccl_built", "rank", "reducescatter",
    "remove_process_set", "rocm_built",
    "shutdown", "size", "start_timeline", "stop_timeline",
]

