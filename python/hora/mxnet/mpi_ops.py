"""Collectives on MXNet NDArrays with Horovod's names and semantics.

Every function here is collective: all ranks must call it with matching
names (unnamed calls are matched by call order). Arrays must be dense and on
the CPU. In-place operations (``allreduce_``, ``broadcast_``, ...) hand the
array's memory to the core through DLPack after MXNet has finished writing
it, so nothing is copied; the others copy the input first. Calls are
synchronous: they return once the result is in place. Argument errors raise
``TypeError``/``ValueError``; ranks that disagree get
:class:`hora.HoraMismatchError` on every rank. ``priority`` is accepted for
Horovod compatibility; hora orders work by submission.
"""

import mxnet as mx
import numpy as np

from hora.common import ops as _ops
from hora.common.arguments import check_process_set, check_root, check_splits, resolve_op
from hora.common.basics import Average, Sum  # noqa: F401 (re-exported by hora.mxnet)

# hora runs every collective over all ranks; Horovod code that passes
# ``process_set=hvd.global_process_set`` keeps working.
global_process_set = None

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.int32, np.int64, np.float16,
                                                np.float32, np.float64))


class _Memory:
    """An NDArray's memory as a DLPack producer: the core reads (and, for
    in-place work, writes) it directly. ``to_dlpack_for_*`` waits for
    MXNet's pending operations on the array first."""

    __slots__ = ("_capsule",)

    def __init__(self, array, write):
        self._capsule = array.to_dlpack_for_write() if write else array.to_dlpack_for_read()

    def __dlpack__(self, stream=None):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def _check(tensor, what):
    if not isinstance(tensor, mx.nd.NDArray):
        raise TypeError(f"{what}: expected an mxnet.nd.NDArray, got {type(tensor).__name__}")
    if tensor.stype != "default":
        raise ValueError(f"{what}: {tensor.stype} arrays are not supported; use "
                         f".tostype('default')")
    if tensor.context.device_type != "cpu":
        raise ValueError(f"{what}: the array is on {tensor.context}, but hora.mxnet handles CPU "
                         f"arrays only; copy it with .as_in_context(mx.cpu())")
    if np.dtype(tensor.dtype) not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"{what}: dtype {np.dtype(tensor.dtype).name} is not supported; "
                        f"supported dtypes are {names}")
    return tensor


def _check_list(tensors, what):
    if isinstance(tensors, mx.nd.NDArray):
        raise TypeError(f"{what}: expected a list of arrays, got a single array")
    return [_check(t, f"{what} (array {i})") for i, t in enumerate(tensors)]


def _from_numpy(array, dtype):
    return mx.nd.array(array, dtype=dtype)


# --- allreduce ---------------------------------------------------------------

def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, op=None):
    """Reduces ``tensor`` over all ranks in place and returns it. ``op`` is
    Average (the default), Sum, Min, Max or Product (``average`` is the
    deprecated spelling); ``prescale_factor``/``postscale_factor`` multiply
    the input and the result (floating-point arrays only)."""
    check_process_set(process_set, "allreduce_")
    op = resolve_op(average, op, "allreduce_")
    _check(tensor, "allreduce_")
    name = _ops._check_name(name, "allreduce")
    _ops.allreduce_(_Memory(tensor, True), name, op, prescale_factor, postscale_factor)
    return tensor


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, process_set=None, op=None):
    """Returns a new array with the reduction of ``tensor`` over all ranks;
    see :func:`allreduce_`."""
    _check(tensor, "allreduce")
    return allreduce_(tensor.copy(), average, name, priority, prescale_factor, postscale_factor,
                      process_set, op)


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=None, op=None):
    """In-place allreduce of a list of arrays negotiated and fused as one
    unit; returns the list."""
    check_process_set(process_set, "grouped_allreduce_")
    op = resolve_op(average, op, "grouped_allreduce_")
    tensors = _check_list(tensors, "grouped_allreduce_")
    if tensors:
        _ops.grouped_allreduce_([_Memory(t, True) for t in tensors], name, op, prescale_factor,
                                postscale_factor)
    return tensors


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=None, op=None):
    """:func:`grouped_allreduce_` into new arrays."""
    tensors = _check_list(tensors, "grouped_allreduce")
    return grouped_allreduce_([t.copy() for t in tensors], average, name, priority,
                              prescale_factor, postscale_factor, process_set, op)


# --- allgather, broadcast, alltoall, reducescatter -----------------------------

def _check_rows(tensor, what):
    if tensor.ndim == 0:
        raise ValueError(f"{what}: cannot split a scalar into rows; reshape it to (1,)")


def allgather(tensor, name=None, priority=0, process_set=None):
    """Concatenates every rank's ``tensor`` along the first dimension, in rank
    order; the first dimension may differ between ranks."""
    check_process_set(process_set, "allgather")
    _check(tensor, "allgather")
    _check_rows(tensor, "allgather")
    return _from_numpy(_ops.allgather(tensor.asnumpy(), name), tensor.dtype)


def broadcast_(tensor, root_rank, name=None, priority=0, process_set=None):
    """Overwrites ``tensor`` with ``root_rank``'s values; returns it."""
    check_process_set(process_set, "broadcast_")
    root_rank = check_root(root_rank, "broadcast_")
    _check(tensor, "broadcast_")
    _ops.broadcast_(_Memory(tensor, True), root_rank, _ops._check_name(name, "broadcast"))
    return tensor


def broadcast(tensor, root_rank, name=None, priority=0, process_set=None):
    """Returns a new array holding ``root_rank``'s ``tensor``."""
    _check(tensor, "broadcast")
    return broadcast_(tensor.copy(), root_rank, name, priority, process_set)


def alltoall(tensor, splits=None, name=None, priority=0, process_set=None):
    """Sends ``splits[r]`` consecutive rows of ``tensor`` to rank ``r`` and
    returns the rows received from every rank, in rank order (without
    ``splits`` the first dimension is divided evenly)."""
    check_process_set(process_set, "alltoall")
    _check(tensor, "alltoall")
    _check_rows(tensor, "alltoall")
    if splits is not None:
        values = splits.asnumpy() if isinstance(splits, mx.nd.NDArray) else np.asarray(splits)
        splits = check_splits(values.reshape(-1).tolist(), "alltoall")
    output, _ = _ops.alltoall(tensor.asnumpy(), splits, name)
    return _from_numpy(output, tensor.dtype)


def reducescatter(tensor, op=Average, name=None, priority=0, process_set=None,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over all ranks and returns this rank's block of
    rows (the first ``rows % size()`` ranks get one extra row)."""
    check_process_set(process_set, "reducescatter")
    op = resolve_op(None, op, "reducescatter")
    _check(tensor, "reducescatter")
    _check_rows(tensor, "reducescatter")
    result = _ops.reducescatter(tensor.asnumpy(), name, op, prescale_factor, postscale_factor)
    return _from_numpy(result, tensor.dtype)


def barrier(process_set=None):
    """Returns once every rank has called ``barrier``."""
    check_process_set(process_set, "barrier")
    _ops.barrier()


def join():
    """Marks this rank as out of data (see :func:`hora.join`); returns the
    rank that joined last."""
    return _ops.join()
