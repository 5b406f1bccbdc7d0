"""Collectives on MXNet NDArrays with Horovod's names and semantics.

Every function here is collective: all ranks must call it with matching
names (unnamed calls are matched by call order). Arrays must be dense and on
the CPU. In-place operations (``allreduce_``, ``broadcast_``, ...) hand the
array's memory to the core through DLPack after MXNet has finished writing
it, so nothing is copied; the others copy the input first. Calls are
synchronous: they return once the result is in place. Argument errors raise
``TypeError``/``ValueError``; ranks that disagree get
:class:`hora.HoraMismatchError` on every rank. ``priority`` is accepted for
Horovod compatibility; hora orders work by submission. The grouped forms
(``grouped_allreduce``, ``grouped_allgather``, ``grouped_reducescatter``)
take a list of arrays, negotiated and fused as one unit under one base
name, and return a list.

Every collective takes ``process_set`` (default ``global_process_set``), as
in Horovod: with a :class:`hora.ProcessSet` it runs among that set's ranks
only, which alone call it; Average divides by the set's size, results come
in the set's rank order, alltoall splits have one entry per member,
``root_rank`` stays a global rank (one of the set's), and unnamed calls are
matched by call order within each set. A rank outside the set, or a set
that is not registered, gets ``ValueError``. As in Horovod, a ``name`` that
is not a string counts as no name.

The runtime functions (``init``, ``rank``, ``size``, ...) and the reduce
ops are importable from here too, as from Horovod's ``mxnet.mpi_ops``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import mxnet as mx
import numpy as np

from hora.common import ops as _ops
from hora.common._adapter.handles import Handle, synchronize
from hora.common._adapter.naming import check_name, group_names
from hora.common._adapter.submission import KIND_ALLGATHER, KIND_REDUCESCATTER, submit_arrays
from hora.common._adapter.checks import check_root, check_splits, op_value, resolve_op
from hora.common.basics import (  # noqa: F401 (Horovod's mxnet.mpi_ops has them)
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, cross_rank, cross_size, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, shutdown, size)
from hora.common._adapter.checks import process_set_id  # noqa: F401 (as below)
from hora.common.process_sets import (  # noqa: F401 (Horovod's mxnet.mpi_ops has them)
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from hora.mxnet._arrays import SUPPORTED_DTYPES  # noqa: F401 (public here since the start)
from hora.mxnet._arrays import Memory, check_array, check_arrays, set_object


def handle_average_backwards_compatibility(op, average):
    """Horovod's helper: the reduce op from ``op`` and the deprecated
    ``average`` (Average when neither is given)."""
    return resolve_op(average, op, "handle_average_backwards_compatibility")


def _name(name):
    """As Horovod's MXNet ops: a name that is not a string counts as none
    (the call is then matched by call order)."""
    return name if isinstance(name, str) else None


def _from_numpy(array, dtype):
    return mx.nd.array(array, dtype=dtype)


# --- allreduce ---------------------------------------------------------------

def allreduce_(tensor: mx.nd.NDArray, average: bool | None = None, name: str | None = None,
               priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set,
               op: ReduceOp | int | None = None) -> mx.nd.NDArray:
    """Reduces ``tensor`` over all ranks in place and returns it. ``op`` is
    Average (the default), Sum, Min, Max or Product (``average`` is the
    deprecated spelling); ``prescale_factor``/``postscale_factor`` multiply
    the input and the result (integers: in float64, truncated toward zero,
    as Horovod does). ``process_set`` limits it to that set's ranks (Average
    then divides by the set's size)."""
    process_set = set_object(process_set, "allreduce_")
    op = resolve_op(average, op, "allreduce_")
    check_array(tensor, "allreduce_")
    name = check_name(_name(name), "allreduce", process_set_id(process_set))
    _ops.allreduce_(Memory(tensor, True), name, op, prescale_factor, postscale_factor,
                    process_set=process_set)
    return tensor


def allreduce(tensor: mx.nd.NDArray, average: bool | None = None, name: str | None = None,
              priority: int = 0, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set,
              op: ReduceOp | int | None = None) -> mx.nd.NDArray:
    """Returns a new array with the reduction of ``tensor`` over all ranks;
    see :func:`allreduce_`."""
    check_array(tensor, "allreduce")
    return allreduce_(tensor.copy(), average, name, priority, prescale_factor, postscale_factor,
                      process_set, op)


def grouped_allreduce_(tensors: Iterable[mx.nd.NDArray], average: bool | None = None,
                       name: str | None = None, priority: int = 0, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                       op: ReduceOp | int | None = None) -> list[mx.nd.NDArray]:
    """In-place allreduce of a list of arrays negotiated and fused as one
    unit; returns the list."""
    process_set = set_object(process_set, "grouped_allreduce_")
    op = resolve_op(average, op, "grouped_allreduce_")
    tensors = check_arrays(tensors, "grouped_allreduce_")
    if tensors:
        _ops.grouped_allreduce_([Memory(t, True) for t in tensors], _name(name), op,
                                prescale_factor,
                                postscale_factor, process_set=process_set)
    return tensors


def grouped_allreduce(tensors: Iterable[mx.nd.NDArray], average: bool | None = None,
                      name: str | None = None, priority: int = 0, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set,
                      op: ReduceOp | int | None = None) -> list[mx.nd.NDArray]:
    """:func:`grouped_allreduce_` into new arrays."""
    tensors = check_arrays(tensors, "grouped_allreduce")
    return grouped_allreduce_([t.copy() for t in tensors], average, name, priority,
                              prescale_factor, postscale_factor, process_set, op)


# --- allgather, broadcast, alltoall, reducescatter -----------------------------

def _check_rows(tensor, what):
    if tensor.ndim == 0:
        raise ValueError(f"{what}: cannot split a scalar into rows; reshape it to (1,)")


def _check_row_arrays(tensors, what):
    """:func:`check_arrays` of a grouped collective's list, refusing
    scalars too; each array is named by its position in the list."""
    tensors = check_arrays(tensors, what)
    for i, t in enumerate(tensors):
        _check_rows(t, f"{what} (array {i})")
    return tensors


def _run_grouped(kind, tensors, name, what, process_set, op=Sum, prescale_factor=1.0,
                 postscale_factor=1.0):
    """Submits copies of ``tensors`` as one grouped collective of ``kind``
    (negotiated and fused as a unit, member ``i`` named ``<name>.i``),
    waits, and returns the core's result for each as a new NDArray. ``op``
    and the scale factors matter to reducescatter only."""
    names = group_names(_name(name), len(tensors), what, process_set_id(process_set))
    inputs = [t.asnumpy() for t in tensors]
    works = submit_arrays(kind, names, inputs, op=op_value(op), prescale=prescale_factor,
                          postscale=postscale_factor, grouped=True,
                          process_set=process_set_id(process_set))

    def finish(done):
        return [np.frombuffer(w.result_buffer(), dtype=x.dtype).reshape(w.output_shape)
                for w, x in zip(done, inputs)]
    return [_from_numpy(r, t.dtype)
            for r, t in zip(synchronize(Handle(works, finish)), tensors)]


def allgather(tensor: mx.nd.NDArray, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> mx.nd.NDArray:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank
    order (the set's, with ``process_set``); the first dimension may differ
    between ranks."""
    process_set = set_object(process_set, "allgather")
    check_array(tensor, "allgather")
    _check_rows(tensor, "allgather")
    return _from_numpy(_ops.allgather(tensor.asnumpy(), _name(name), process_set=process_set),
                       tensor.dtype)


def grouped_allgather(tensors: Iterable[mx.nd.NDArray], name: str | None = None,
                      priority: int = 0,
                      process_set: ProcessSet = global_process_set) -> list[mx.nd.NDArray]:
    """:func:`allgather` of each array of a list, negotiated as one unit;
    returns a list of new arrays, one per input, in its order. ``name`` is
    the group's base name (member ``i`` is ``<name>.i``); the first
    dimension of each array may differ between ranks, the others not."""
    process_set = set_object(process_set, "grouped_allgather")
    tensors = _check_row_arrays(tensors, "grouped_allgather")
    if not tensors:
        return []
    return _run_grouped(KIND_ALLGATHER, tensors, name, "grouped_allgather", process_set)


def broadcast_(tensor: mx.nd.NDArray, root_rank: int, name: str | None = None, priority: int = 0,
               process_set: ProcessSet = global_process_set) -> mx.nd.NDArray:
    """Overwrites ``tensor`` with ``root_rank``'s values; returns it.
    ``root_rank`` is a global rank, in ``process_set`` when one is given."""
    process_set = set_object(process_set, "broadcast_")
    root_rank = check_root(root_rank, "broadcast_")
    check_array(tensor, "broadcast_")
    _ops.broadcast_(Memory(tensor, True), root_rank,
                    check_name(_name(name), "broadcast", process_set_id(process_set)),
                    process_set=process_set)
    return tensor


def broadcast(tensor: mx.nd.NDArray, root_rank: int, name: str | None = None, priority: int = 0,
              process_set: ProcessSet = global_process_set) -> mx.nd.NDArray:
    """Returns a new array holding ``root_rank``'s ``tensor``."""
    check_array(tensor, "broadcast")
    return broadcast_(tensor.copy(), root_rank, name, priority, process_set)


def alltoall(tensor: mx.nd.NDArray, splits: mx.nd.NDArray | Sequence[int] | None = None,
             name: str | None = None, priority: int = 0,
             process_set: ProcessSet = global_process_set,
             ) -> mx.nd.NDArray | tuple[mx.nd.NDArray, mx.nd.NDArray]:
    """Sends ``splits[r]`` consecutive rows of ``tensor`` to rank ``r`` and
    gathers the rows received from every rank, in rank order. With
    ``splits`` (an NDArray or a sequence of ints) it returns ``(output,
    received_splits)``, ``received_splits`` being an int32 NDArray of how
    many rows came from each rank; without, the first dimension is divided
    evenly and only ``output`` is returned (both as Horovod). With
    ``process_set`` the ranks are the set's, in its order, one split (and
    one received split) per member."""
    process_set = set_object(process_set, "alltoall")
    check_array(tensor, "alltoall")
    _check_rows(tensor, "alltoall")
    with_splits = splits is not None
    if with_splits:
        values = splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else np.asarray(splits)
        splits = check_splits(values.reshape(-1).tolist(), "alltoall")
    output, received = _ops.alltoall(tensor.asnumpy(), splits, _name(name),
                                     process_set=process_set)
    output = _from_numpy(output, tensor.dtype)
    if not with_splits:
        return output
    return output, mx.nd.array(received, dtype=np.int32)


def reducescatter(tensor: mx.nd.NDArray, op: ReduceOp | int = Average, name: str | None = None,
                  priority: int = 0, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> mx.nd.NDArray:
    """Reduces ``tensor`` over all ranks and returns this rank's block of
    rows (the first ``rows % size()`` ranks get one extra row; the set's
    ranks and size with ``process_set``)."""
    process_set = set_object(process_set, "reducescatter")
    op = resolve_op(None, op, "reducescatter")
    check_array(tensor, "reducescatter")
    _check_rows(tensor, "reducescatter")
    result = _ops.reducescatter(tensor.asnumpy(), _name(name), op, prescale_factor,
                                postscale_factor,
                                process_set=process_set)
    return _from_numpy(result, tensor.dtype)


def grouped_reducescatter(tensors: Iterable[mx.nd.NDArray], op: ReduceOp | int = Average,
                          name: str | None = None, priority: int = 0,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[mx.nd.NDArray]:
    """:func:`reducescatter` of each array of a list, negotiated and fused as
    one unit; returns a list of this rank's blocks, one per input, in its
    order. ``name`` is the group's base name (member ``i`` is
    ``<name>.i``)."""
    process_set = set_object(process_set, "grouped_reducescatter")
    op = resolve_op(None, op, "grouped_reducescatter")
    tensors = _check_row_arrays(tensors, "grouped_reducescatter")
    if not tensors:
        return []
    return _run_grouped(KIND_REDUCESCATTER, tensors, name, "grouped_reducescatter", process_set,
                        op, prescale_factor, postscale_factor)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank (of ``process_set``) has called ``barrier``."""
    _ops.barrier(process_set=set_object(process_set, "barrier"))


def join() -> int:
    """Marks this rank as out of data (see :func:`hora.join`); returns the
    rank that joined last."""
    return _ops.join()
