"""Collectives on NumPy arrays (and anything exposing the buffer protocol).

Every function here is collective: each rank must call it with a matching
name (or, for unnamed calls, in the same order). Results equal a NumPy
reduction over all ranks' inputs. Argument errors raise ``ValueError`` or
``TypeError`` at once; disagreements between ranks raise
:class:`~hora.HoraMismatchError` on every rank.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Sequence
from typing import Any, Callable

import numpy as np
from numpy.typing import ArrayLike

from hora._loader import _C
from hora.common._adapter import submission
from hora.common._adapter.handles import Handle, OneHandle, poll, synchronize
from hora.common._adapter.naming import auto_name, check_name, group_names
from hora.common._adapter.submission import (
    KIND_ALLGATHER, KIND_ALLREDUCE, KIND_ALLTOALL, KIND_BARRIER, KIND_BROADCAST,
    KIND_REDUCESCATTER, submit_arrays)
from hora.common._adapter.checks import op_value, process_set_id
from hora.common.reduce_op import ReduceOp
from hora.common.process_sets import ProcessSet, global_process_set

__all__ = [
    "Handle", "allgather", "allgather_async", "allgather_object", "allreduce", "allreduce_",
    "allreduce_async", "allreduce_async_", "alltoall", "alltoall_async", "barrier", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "broadcast_object",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
    "grouped_allreduce_async_", "join", "poll", "reducescatter", "reducescatter_async",
    "synchronize",
]


def _as_array(tensor: ArrayLike, what: str) -> np.ndarray:
    array = np.asarray(tensor)
    if array.dtype == object:
        raise TypeError(f"{what}: cannot reduce Python objects; use "
                        f"broadcast_object/allgather_object")
    return array


def _check_writable_array(tensor: Any, kind: str, name: str) -> None:
    if not isinstance(tensor, np.ndarray) and not hasattr(tensor, "__dlpack__"):
        raise TypeError(f"{kind} '{name}' writes its result into its input, which must be a "
                        f"writable array, got {type(tensor).__name__}")


def _owned_result(dtype: np.dtype) -> Callable[[Any], np.ndarray]:
    def finish(works):
        work = works[0]
        return np.frombuffer(work.result_buffer(), dtype=dtype).reshape(work.output_shape)
    return finish


def _returns(values: Any) -> Callable[[Any], Any]:
    return lambda works: values


# --- allreduce ---------------------------------------------------------------

def _check_out(out: Any, x: np.ndarray, what: str) -> np.ndarray:
    """``out`` if it can take ``x``'s result, else ValueError naming both."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{what}: out must be a NumPy array, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"{what}: out has shape {out.shape} and dtype {out.dtype}, the input "
                         f"{x.shape} and {x.dtype}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{what}: out must be a writable C-contiguous array")
    if np.may_share_memory(out, x):
        raise ValueError(f"{what}: out overlaps the input; use the in-place variant "
                         f"(allreduce_async_) to reduce an array into itself")
    return out


def allreduce_async(tensor: ArrayLike, name: str | None = None,
                    op: ReduceOp | int = ReduceOp.Average, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set, *,
                    out: np.ndarray | None = None) -> Handle:
    """Starts an allreduce and returns a :class:`Handle`; ``synchronize`` gives
    a new array holding the reduction of ``tensor`` over all ranks, or
    ``out`` (an array of the same shape and dtype, sharing no memory with
    ``tensor``) holding it."""
    name = check_name(name, "allreduce", process_set_id(process_set))
    x = _as_array(tensor, f"allreduce '{name}'")
    out = np.empty_like(x) if out is None else _check_out(out, x, f"allreduce '{name}'")
    works = submit_arrays(KIND_ALLREDUCE, [name], [x], [out], op_value(op), 0, prescale_factor,
                          postscale_factor,
                          process_set=process_set_id(process_set))
    return OneHandle(works[0], out)


def allreduce(tensor: ArrayLike, name: str | None = None, op: ReduceOp | int = ReduceOp.Average,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduces ``tensor`` over all ranks with ``op`` (Average by default) and
    returns the result as a new array. ``prescale_factor`` multiplies the
    input before the reduction and ``postscale_factor`` the result after it
    (integers: in float64, truncated toward zero, as Horovod does).
    float16/bfloat16 accumulate in float32 (on the ring between hosts they
    travel as halves, rounded once per hop)."""
    return synchronize(allreduce_async(tensor, name, op, prescale_factor, postscale_factor,
                                       process_set=process_set))


def allreduce_async_(tensor: Any, name: str | None = None, op: ReduceOp | int = ReduceOp.Average,
                     prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """In-place :func:`allreduce_async`: the result overwrites ``tensor``, which
    must be a writable contiguous array."""
    name = check_name(name, "allreduce", process_set_id(process_set))
    _check_writable_array(tensor, "allreduce_", name)
    work = submission.submit_one_array(KIND_ALLREDUCE, name, tensor, True, op_value(op),
                                       prescale_factor, postscale_factor,
                                       process_set_id(process_set))
    return OneHandle(work, tensor)


def allreduce_(tensor: Any, name: str | None = None, op: ReduceOp | int = ReduceOp.Average,
               prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> Any:
    """In-place :func:`allreduce`; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, name, op, prescale_factor, postscale_factor,
                                        process_set=process_set))


def grouped_allreduce_async(tensors: Iterable[ArrayLike], name: str | None = None,
                            op: ReduceOp | int = ReduceOp.Average, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set, *,
                            out: Sequence[np.ndarray] | None = None) -> Handle:
    """Starts an allreduce of a list of tensors that are negotiated and fused
    as one unit; ``synchronize`` gives a list of new arrays, or the arrays
    of ``out`` (one per tensor, each of its tensor's shape and dtype; none
    may share memory with any of the tensors or with another)."""
    tensors = list(tensors)
    names = group_names(name, len(tensors), "grouped_allreduce", process_set_id(process_set))
    inputs = [_as_array(t, f"grouped_allreduce '{n}'") for t, n in zip(tensors, names)]
    if out is None:
        outputs = [np.empty_like(x) for x in inputs]
    else:
        out = list(out)
        if len(out) != len(inputs):
            raise ValueError(f"grouped_allreduce '{names[0] if names else name}': {len(inputs)} "
                             f"tensors but {len(out)} arrays in out")
        outputs = [_check_out(o, x, f"grouped_allreduce '{n}'")
                   for o, x, n in zip(out, inputs, names)]
    works = submit_arrays(KIND_ALLREDUCE, names, inputs, outputs, op_value(op), 0,
                          prescale_factor, postscale_factor, grouped=True,
                          process_set=process_set_id(process_set))
    return Handle(works, _returns(outputs))


def grouped_allreduce(tensors: Iterable[ArrayLike], name: str | None = None,
                      op: ReduceOp | int = ReduceOp.Average, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[np.ndarray]:
    """Allreduce of a list of tensors as one fused unit; returns a list."""
    return synchronize(grouped_allreduce_async(tensors, name, op, prescale_factor,
                                               postscale_factor, process_set=process_set))


def grouped_allreduce_async_(tensors: Iterable[Any], name: str | None = None,
                             op: ReduceOp | int = ReduceOp.Average, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> Handle:
    """In-place :func:`grouped_allreduce_async`."""
    tensors = list(tensors)
    names = group_names(name, len(tensors), "grouped_allreduce", process_set_id(process_set))
    for tensor, tensor_name in zip(tensors, names):
        _check_writable_array(tensor, "grouped_allreduce_", tensor_name)
    works = submit_arrays(KIND_ALLREDUCE, names, tensors, tensors, op_value(op), 0,
                          prescale_factor, postscale_factor, grouped=True,
                          process_set=process_set_id(process_set))
    return Handle(works, _returns(tensors))


def grouped_allreduce_(tensors: Iterable[Any], name: str | None = None,
                       op: ReduceOp | int = ReduceOp.Average, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[Any]:
    """In-place :func:`grouped_allreduce`; returns the list of tensors."""
    return synchronize(grouped_allreduce_async_(tensors, name, op, prescale_factor,
                                                postscale_factor, process_set=process_set))


# --- allgather, broadcast, alltoall, reducescatter ----------------------------

def allgather_async(tensor: ArrayLike, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts an allgather; see :func:`allgather`."""
    name = check_name(name, "allgather", process_set_id(process_set))
    x = _as_array(tensor, f"allgather '{name}'")
    works = submit_arrays(KIND_ALLGATHER, [name], [x],
                          process_set=process_set_id(process_set))
    return Handle(works, _owned_result(x.dtype))


def allgather(tensor: ArrayLike, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank
    order. The first dimension may differ between ranks; the others must not."""
    return synchronize(allgather_async(tensor, name, process_set=process_set))


def broadcast_async(tensor: ArrayLike, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts a broadcast; see :func:`broadcast`."""
    name = check_name(name, "broadcast", process_set_id(process_set))
    x = _as_array(tensor, f"broadcast '{name}'")
    out = np.empty_like(x)
    works = submit_arrays(KIND_BROADCAST, [name], [x], [out], root=int(root_rank),
                          process_set=process_set_id(process_set))
    return OneHandle(works[0], out)


def broadcast(tensor: ArrayLike, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Returns a new array holding ``root_rank``'s ``tensor`` on every rank."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set=process_set))


def broadcast_async_(tensor: Any, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """In-place :func:`broadcast_async`."""
    name = check_name(name, "broadcast", process_set_id(process_set))
    _check_writable_array(tensor, "broadcast_", name)
    works = submit_arrays(KIND_BROADCAST, [name], [tensor], [tensor], root=int(root_rank),
                          process_set=process_set_id(process_set))
    return OneHandle(works[0], tensor)


def broadcast_(tensor: Any, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> Any:
    """Overwrites ``tensor`` with ``root_rank``'s values; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set=process_set))


def alltoall_async(tensor: ArrayLike, splits: ArrayLike | None = None,
                   name: str | None = None, process_set: ProcessSet = global_process_set) -> Handle:
    """Starts an alltoall; see :func:`alltoall`."""
    name = check_name(name, "alltoall", process_set_id(process_set))
    x = _as_array(tensor, f"alltoall '{name}'")
    if splits is not None:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    works = submit_arrays(KIND_ALLTOALL, [name], [x], splits=splits,
                          process_set=process_set_id(process_set))

    def finish(works):
        received = np.asarray(works[0].received_splits, dtype=np.int64)
        return _owned_result(x.dtype)(works), received
    return Handle(works, finish)


def alltoall(tensor: ArrayLike, splits: ArrayLike | None = None,
             name: str | None = None,
             process_set: ProcessSet = global_process_set) -> tuple[np.ndarray, np.ndarray]:
    """Sends ``splits[r]`` consecutive rows of ``tensor`` to rank ``r`` and
    returns ``(output, received_splits)``: the rows received from every rank,
    concatenated in rank order, and how many came from each. Without
    ``splits`` the first dimension is divided evenly."""
    return synchronize(alltoall_async(tensor, splits, name, process_set=process_set))


def reducescatter_async(tensor: ArrayLike, name: str | None = None,
                        op: ReduceOp | int = ReduceOp.Average, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0,
                        process_set: ProcessSet = global_process_set) -> Handle:
    """Starts a reducescatter; see :func:`reducescatter`."""
    name = check_name(name, "reducescatter", process_set_id(process_set))
    x = _as_array(tensor, f"reducescatter '{name}'")
    works = submit_arrays(KIND_REDUCESCATTER, [name], [x], op=op_value(op),
                          prescale=prescale_factor, postscale=postscale_factor,
                          process_set=process_set_id(process_set))
    return Handle(works, _owned_result(x.dtype))


def reducescatter(tensor: ArrayLike, name: str | None = None,
                  op: ReduceOp | int = ReduceOp.Average, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> np.ndarray:
    """Reduces ``tensor`` over all ranks and returns this rank's block of rows.
    When the first dimension does not divide evenly, the first
    ``rows % size()`` ranks get one extra row."""
    return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor,
                                           process_set=process_set))


# --- synchronization and objects ---------------------------------------------

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank has called ``barrier``."""
    name = auto_name("barrier", process_set_id(process_set))
    works = submit_arrays(KIND_BARRIER, [name], [np.zeros(0, np.uint8)],
                          process_set=process_set_id(process_set))
    synchronize(Handle(works, _returns(None)))


def join() -> int:
    """Marks this rank as out of data. Until every rank has joined, this rank
    takes part in other ranks' allreduces with neutral values (zeros for
    sums; an Average still divides by ``size()``, as in Horovod, unless
    ``HORA_JOIN_AVERAGE=contributors``). Returns the rank that joined last."""
    return submission.join()


def _pickled(obj: Any) -> tuple[np.ndarray, Exception | None]:
    """``obj`` as cloudpickle bytes (as Horovod sends objects: lambdas,
    local functions and classes of ``__main__`` travel too), or, when it
    cannot be pickled, the reason as bytes, for the other ranks to raise
    with, and the error itself."""
    import cloudpickle
    try:
        return np.frombuffer(cloudpickle.dumps(obj), np.uint8), None
    except Exception as error:  # noqa: BLE001 - any failure is reported to every rank
        return np.frombuffer(f"{type(error).__name__}: {error}".encode(), np.uint8), error


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Returns ``root_rank``'s ``obj`` on every rank, sent with cloudpickle
    as Horovod does. An object the root cannot pickle raises there, and
    ``pickle.PicklingError`` naming the root and the reason on the other
    ranks (none of them waits)."""
    name = check_name(name, "broadcast_object", process_set_id(process_set))
    root = _C.rank() == root_rank
    payload, failure = _pickled(obj) if root else (None, None)
    # [failed, bytes]: on a failure the bytes are the reason
    header = np.array([0 if failure is None else 1, 0 if payload is None else payload.size],
                      np.int64)
    broadcast_(header, root_rank, name + ".length", process_set=process_set)
    data = np.empty(int(header[1]), np.uint8) if payload is None else payload.copy()
    broadcast_(data, root_rank, name + ".data", process_set=process_set)
    if root:
        if failure is not None:
            raise failure  # the root's own error, with its traceback
        return obj
    if header[0]:
        raise pickle.PicklingError(
            f"broadcast_object '{name}': rank {root_rank} could not pickle its object "
            f"({data.tobytes().decode(errors='replace')})")
    return pickle.loads(data.tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Returns the list of every rank's ``obj``, in rank order (the set's
    ranks with ``process_set``), sent with cloudpickle as Horovod does. An
    object some rank cannot pickle raises ``pickle.PicklingError`` on every
    rank, naming those ranks and why (none of them waits)."""
    name = check_name(name, "allgather_object", process_set_id(process_set))
    payload, failure = _pickled(obj)
    headers = allgather(np.array([[0 if failure is None else 1, payload.size]], np.int64),
                        name + ".length", process_set=process_set)
    data = allgather(payload, name + ".data", process_set=process_set).tobytes()
    parts, offset = [], 0
    for _, length in headers:
        parts.append(data[offset:offset + int(length)])
        offset += int(length)
    failed = [i for i, (bad, _) in enumerate(headers) if bad]
    if failed:
        ranks = process_set.ranks if process_set is not None and process_set.ranks else None
        reasons = "; ".join(f"rank {ranks[i] if ranks else i}: "
                            f"{parts[i].decode(errors='replace')}" for i in failed)
        raise pickle.PicklingError(f"allgather_object '{name}': could not pickle the object "
                                   f"of {reasons}")
    return [pickle.loads(part) for part in parts]
