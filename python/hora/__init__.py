"""hora: data-parallel training with ring-allreduce, in the style of Horovod.

The top-level package works on NumPy arrays; ``hora.torch`` and friends adapt
the same core to each framework.
"""

from hora.common.basics import (
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, build_info, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_homogeneous,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rank, rocm_built, shutdown, size, start_timeline, stop_timeline)
from hora.common.exceptions import (
    HoraError, HoraInternalError, HoraInvalidArgumentError, HoraMismatchError, HoraShutdownError,
    HoraTimeoutError, HoraTypeError, HorovodInternalError)
from hora.common.process_sets import (
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from hora.common.ops import (
    Handle, allgather, allgather_async, allgather_object, allreduce, allreduce_, allreduce_async,
    allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
    broadcast_async_, broadcast_object, grouped_allreduce, grouped_allreduce_,
    grouped_allreduce_async, grouped_allreduce_async_, join, poll, reducescatter,
    reducescatter_async, synchronize)
from hora.runner.run_func import run

__all__ = [
    "Adasum", "Average", "Handle", "HoraError", "HoraInternalError", "HoraInvalidArgumentError",
    "HoraMismatchError", "HoraShutdownError", "HoraTimeoutError", "HoraTypeError",
    "HorovodInternalError", "Max", "Min", "Product",
    "ProcessSet", "add_process_set", "global_process_set", "remove_process_set",
    "ReduceOp", "Sum", "allgather", "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "build_info", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built", "gloo_built",
    "gloo_enabled", "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "init", "is_homogeneous", "is_initialized", "join", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll", "rank",
    "reducescatter", "reducescatter_async", "rocm_built", "run", "shutdown", "size",
    "start_timeline",
    "stop_timeline", "synchronize",
]

__version__ = build_info()["version"]
