"""hora for PyTorch, a drop-in for ``horovod.torch``.

``import hora.torch as hvd`` gives the runtime (``init``, ``rank``,
``size``, ``local_rank``, ...), collectives on CPU and CUDA ``torch.Tensor`` s
(``allreduce``, ``allgather``, ``broadcast``, ``alltoall``,
``reducescatter`` and their grouped, in-place and async variants, several
of them differentiable), ``DistributedOptimizer``, ``broadcast_parameters``,
``broadcast_optimizer_state``, ``broadcast_object``, ``allgather_object``,
``Compression`` and ``SyncBatchNorm``; each takes ``process_set=`` to run
among a subset of the ranks (``ProcessSet``, ``add_process_set``,
``remove_process_set``, ``global_process_set``). Launch scripts with
``horarun -np N python train.py`` (or ``python -m hora.runner``).
"""

from hora.common.basics import (
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, build_info, ccl_built, cross_rank,
    cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_homogeneous,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    nccl_built, rank, rocm_built, shutdown, size, start_timeline, stop_timeline)
from hora.common.exceptions import (
    HoraError, HoraInternalError, HoraInvalidArgumentError, HoraMismatchError, HoraShutdownError,
    HoraTimeoutError, HoraTypeError, HorovodInternalError, HostsUpdatedInterrupt)
from hora.torch._compile import compile
from hora.torch.compression import Compression, Compressor
from hora.torch.functions import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from hora.torch.mpi_ops import (
    Handle, ProcessSet, add_process_set, allgather, allgather_async, allreduce, allreduce_,
    allreduce_async, allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
    broadcast_async, broadcast_async_, global_process_set, grouped_allgather,
    grouped_allgather_async, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async, join, poll,
    reducescatter, reducescatter_async, remove_process_set, sparse_allreduce_async, synchronize)
from hora.torch.optimizer import DistributedOptimizer
from hora.torch.sharding_checks import declare_elementwise
from hora.torch.sync_batch_norm import SyncBatchNorm

from hora.torch import elastic  # noqa: E402  (hvd.elastic.run, after the names it uses)

__all__ = [
    "Adasum", "Average", "Compression", "Compressor", "DistributedOptimizer", "Handle",
    "HorovodInternalError", "HostsUpdatedInterrupt", "HoraError", "HoraInternalError",
    "HoraInvalidArgumentError", "HoraMismatchError", "HoraShutdownError", "HoraTimeoutError",
    "HoraTypeError", "Max", "Min", "ProcessSet",
    "Product", "ReduceOp", "Sum", "SyncBatchNorm", "add_process_set", "allgather",
    "allgather_async", "allgather_object",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async",
    "barrier", "broadcast", "compile", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "elastic", "broadcast_optimizer_state", "broadcast_parameters",
    "build_info", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "declare_elementwise",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "init", "is_homogeneous", "is_initialized", "join",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "poll", "rank", "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built",
    "shutdown", "size",
    "sparse_allreduce_async", "start_timeline", "stop_timeline", "synchronize"]
