"""Checks MXNet NDArrays (and ``process_set=`` arguments) and hands their
memory to hora's core; shared by the collectives (``mpi_ops``), the object
functions (``functions``) and the training helpers (``training``)."""

from __future__ import annotations

from collections.abc import Iterable

import mxnet as mx
import numpy as np

from hora.common._adapter.checks import process_set_object, unsupported_dtype

SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (np.uint8, np.int8, np.int32, np.int64, np.float16,
                                                np.float32, np.float64))


class Memory:
    """An NDArray's memory as a DLPack producer: the core reads (and, for
    in-place work, writes) it directly. ``to_dlpack_for_*`` waits for
    MXNet's pending operations on the array first."""

    __slots__ = ("_capsule",)

    def __init__(self, array: mx.nd.NDArray, write: bool) -> None:
        self._capsule = array.to_dlpack_for_write() if write else array.to_dlpack_for_read()

    def __dlpack__(self, stream: object = None) -> object:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU


#: ``process_set`` as a registered :class:`hora.ProcessSet` (None: the
#: global set), or the error for a bad one.
set_object = process_set_object


def check_array(tensor: mx.nd.NDArray, what: str) -> mx.nd.NDArray:
    """``tensor`` when hora can reduce it: a dense CPU NDArray of a
    supported dtype; ``TypeError`` / ``ValueError`` otherwise."""
    if not isinstance(tensor, mx.nd.NDArray):
        raise TypeError(f"{what}: expected an mxnet.nd.NDArray, got {type(tensor).__name__}")
    if tensor.stype != "default":
        raise ValueError(f"{what}: {tensor.stype} arrays are not supported; use "
                         f".tostype('default')")
    if tensor.context.device_type != "cpu":
        raise ValueError(f"{what}: the array is on {tensor.context}, but hora.mxnet handles CPU "
                         f"arrays only; copy it with .as_in_context(mx.cpu())")
    if np.dtype(tensor.dtype) not in SUPPORTED_DTYPES:
        raise unsupported_dtype(what, np.dtype(tensor.dtype).name,
                                [d.name for d in SUPPORTED_DTYPES])
    return tensor


def check_arrays(tensors: Iterable[mx.nd.NDArray], what: str) -> list[mx.nd.NDArray]:
    """:func:`check_array` of each member of a list."""
    if isinstance(tensors, mx.nd.NDArray):
        raise TypeError(f"{what}: expected a list of arrays, got a single array")
    return [check_array(t, f"{what} (array {i})") for i, t in enumerate(tensors)]
