"""Every call that hands tensors to the compiled core (``hora._C``).

The NumPy face and the adapters submit through these functions only, so a
change of the core's submission API is a change of this file. They take
Python-level arguments (names, tensors, a reduce op as an int, scale
factors) and return the core's Work objects, which :mod:`handles` wait on.
The one-tensor functions are on every gradient's path: each is one plain
call into the core, without building lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hora._loader import _C
from hora.common import call_site

# The collective kinds, as the core numbers them.
KIND_ALLREDUCE = 0
KIND_ALLGATHER = 1
KIND_BROADCAST = 2
KIND_ALLTOALL = 3
KIND_REDUCESCATTER = 4
KIND_BARRIER = 5

# dtype name ("float32", "bfloat16", ...) -> the core's code for it
DTYPE_CODES: dict[str, int] = dict(_C.DTYPES)
_BFLOAT16 = DTYPE_CODES["bfloat16"]


def wire(array: Any) -> tuple[Any, int]:
    """The array as the core sees it, and its dtype code (-1: the core
    reads the dtype from the array). NumPy has no native bfloat16, so an
    ml_dtypes bfloat16 array travels as its 16 bits plus the bfloat16 code."""
    dtype = getattr(array, "dtype", None)
    # dtype.kind is cheap and "V" is rare; dtype.name is built on every access
    if getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16":
        return array.view(np.int16), _BFLOAT16
    return array, -1


def submit_arrays(kind: int, names: Sequence[str], inputs: Sequence[Any],
                  outputs: Sequence[Any] | None = None, op: int = 1, root: int = 0,
                  prescale: float = 1.0, postscale: float = 1.0,
                  splits: list[int] | None = None, grouped: bool = False) -> list[Any]:
    """Submits NumPy arrays (or buffer / DLPack producers) as one request;
    an output that is its input makes that member in place. Returns one
    Work per input."""
    if len(inputs) == 1 and (outputs is None or outputs[0] is inputs[0]):
        # One tensor (in place or not): the common case, without the loops.
        array, dtype = wire(inputs[0])
        return _C.submit(kind, names, [array], None if outputs is None else [array], op, root,
                         float(prescale), float(postscale), splits, [dtype], grouped,
                         call_site.describe())
    wire_inputs, dtypes = [], []
    for x in inputs:
        array, dtype = wire(x)
        wire_inputs.append(array)
        dtypes.append(dtype)
    wire_outputs = None
    if outputs is not None:
        wire_outputs = [w if o is i else wire(o)[0]
                        for w, o, i in zip(wire_inputs, outputs, inputs)]
    return _C.submit(kind, names, wire_inputs, wire_outputs, op, root, float(prescale),
                     float(postscale), splits, dtypes, grouped, call_site.describe())


def submit_one_array(kind: int, name: str, array: Any, in_place: bool, op: int,
                     prescale: float, postscale: float) -> Any:
    """Submits one NumPy array (or buffer / DLPack producer); returns its Work."""
    dtype = getattr(array, "dtype", None)
    code = -1
    # wire() written out: this is the per-tensor path of hora.allreduce_async_
    if getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16":
        array, code = array.view(np.int16), _BFLOAT16
    return _C.submit_one(kind, name, array, in_place, op, float(prescale), float(postscale), code,
                         call_site.describe())


def submit_tensors(kind: int, names: Sequence[str], inputs: Sequence[Any],
                   outputs: Sequence[Any] | None, op: int, root: int, prescale: float,
                   postscale: float, splits: list[int] | None, grouped: bool,
                   stream: int = -1) -> list[Any]:
    """Submits framework tensors the core reads through DLPack, with their
    own dtypes. ``stream`` is the CUDA stream that produced GPU tensors
    (-1: host tensors). Returns one Work per input."""
    return _C.submit(kind, names, inputs, outputs, int(op), int(root), float(prescale),
                     float(postscale), splits, [], grouped, call_site.describe(), stream)


def submit_one_host(kind: int, name: str, owner: Any, data_ptr: int, shape: Sequence[int],
                    dtype_code: int, op: int, root: int, prescale: float,
                    postscale: float) -> Any:
    """Submits one contiguous host tensor by pointer, in place: ``owner``
    keeps the memory alive until the Work is released. Returns the Work."""
    return _C.submit_one_host(kind, name, owner, data_ptr, shape, dtype_code, int(op), root,
                              float(prescale), float(postscale), call_site.describe())


def join() -> int:
    """Marks this rank as joined (see :func:`hora.join`); returns the rank
    that joined last."""
    return _C.join()
