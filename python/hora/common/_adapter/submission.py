"""Every call that hands tensors to the compiled core (``hora._C``).

The NumPy face and the adapters submit through these functions only, so a
change of the core's submission API is a change of this file. They take
Python-level arguments (names, tensors, a reduce op as an int, scale
factors) and return the core's Work objects, which :mod:`handles` wait on.
The one-tensor functions are on every gradient's path: each is one plain
call into the core, without building lists.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from hora._loader import _C
from hora.common import call_site

# The collective kinds, as the core numbers them.
_KINDS: dict[str, int] = dict(_C.COLLECTIVE_KINDS)
KIND_ALLREDUCE = _KINDS["allreduce"]
KIND_ALLGATHER = _KINDS["allgather"]
KIND_BROADCAST = _KINDS["broadcast"]
KIND_ALLTOALL = _KINDS["alltoall"]
KIND_REDUCESCATTER = _KINDS["reducescatter"]
KIND_BARRIER = _KINDS["barrier"]

# dtype name ("float32", "bfloat16", ...) -> the core's code for it
DTYPE_CODES: dict[str, int] = dict(_C.DTYPES)
_BFLOAT16 = DTYPE_CODES["bfloat16"]


def wire(array: Any) -> tuple[Any, int]:
    """The array as the core sees it, and its dtype code (-1: the core
    reads the dtype from the array). NumPy has no native bfloat16, so an
    ml_dtypes bfloat16 array travels as its 16 bits plus the bfloat16 code."""
    dtype: Any = getattr(array, "dtype", None)
    # dtype.kind is cheap and "V" is rare; dtype.name is built on every access
    if getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16":
        return array.view(np.int16), _BFLOAT16
    return array, -1


def _make_options(op: int, root: int, prescale: float, postscale: float, in_place: bool,
                  grouped: bool, stream: int, dtypes: Sequence[int],
                  splits: Sequence[int] | None, site: str, process_set: int = 0) -> Any:
    made = _C.CollectiveOptions()
    made.process_set = process_set
    made.op = int(op)
    made.root = int(root)
    made.prescale = float(prescale)
    made.postscale = float(postscale)
    made.in_place = in_place
    made.grouped = grouped
    made.stream = stream
    made.dtypes = list(dtypes)
    made.splits = None if splits is None else [int(s) for s in splits]
    made.site = site
    return made


# One options object per setting, reused: building one costs more than the
# rest of a per-gradient submission. Bounded, since scale factors can vary.
@functools.lru_cache(maxsize=1024)
def _shared_options(op: int, root: int, prescale: float, postscale: float, in_place: bool,
                    grouped: bool, stream: int, dtype: int, process_set: int = 0) -> Any:
    return _make_options(op, root, prescale, postscale, in_place, grouped, stream,
                         () if dtype == -1 else (dtype,), None, "", process_set)


def options(op: int = 1, root: int = 0, prescale: float = 1.0, postscale: float = 1.0,
            in_place: bool = False, grouped: bool = False, stream: int = -1,
            dtypes: Sequence[int] = (), splits: Sequence[int] | None = None,
            process_set: int = 0) -> Any:
    """The core's CollectiveOptions for these settings (and the caller's
    call site at debug log level). ``process_set`` is the set's id (0: every
    rank); ``root`` stays a global rank."""
    if call_site.recording or splits is not None or len(dtypes) > 1:
        return _make_options(op, root, prescale, postscale, in_place, grouped, stream, dtypes,
                             splits, call_site.describe(), process_set)
    return _shared_options(op, root, prescale, postscale, in_place, grouped, stream,
                           dtypes[0] if dtypes else -1, process_set)


def submit_arrays(kind: int, names: Sequence[str], inputs: Sequence[Any],
                  outputs: Sequence[Any] | None = None, op: int = 1, root: int = 0,
                  prescale: float = 1.0, postscale: float = 1.0,
                  splits: list[int] | None = None, grouped: bool = False,
                  process_set: int = 0) -> list[Any]:
    """Submits NumPy arrays (or buffer / DLPack producers) as one request;
    an output that is its input makes that member in place. Returns one
    Work per input."""
    wire_inputs, dtypes = [], []
    for x in inputs:
        array, dtype = wire(x)
        wire_inputs.append(array)
        dtypes.append(dtype)
    wire_outputs = None
    if outputs is not None:
        wire_outputs = [w if o is i else wire(o)[0]
                        for w, o, i in zip(wire_inputs, outputs, inputs)]
    if all(code == -1 for code in dtypes):
        dtypes = []
    return _C.submit(kind, wire_inputs, list(names),
                     options(op, root, prescale, postscale, grouped=grouped, dtypes=dtypes,
                             splits=splits, process_set=process_set),
                     wire_outputs)


def submit_one_array(kind: int, name: str, array: Any, in_place: bool, op: int,
                     prescale: float, postscale: float, process_set: int = 0) -> Any:
    """Submits one NumPy array (or buffer / DLPack producer); returns its Work."""
    dtype: Any = getattr(array, "dtype", None)
    code = -1
    # wire() written out: this is the per-tensor path of hora.allreduce_async_
    if getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16":
        array, code = array.view(np.int16), _BFLOAT16
    if call_site.recording:
        dtypes = () if code == -1 else (code,)
        return _C.submit(kind, array, name,
                         options(op, 0, prescale, postscale, in_place=in_place, dtypes=dtypes,
                                 process_set=process_set))
    return _C.submit(kind, array, name,
                     _shared_options(op, 0, prescale, postscale, in_place, False, -1, code,
                                     process_set))


def submit_tensors(kind: int, names: Sequence[str], inputs: Sequence[Any],
                   outputs: Sequence[Any] | None, op: int, root: int, prescale: float,
                   postscale: float, splits: list[int] | None, grouped: bool,
                   stream: int = -1, process_set: int = 0) -> list[Any]:
    """Submits framework tensors the core reads through DLPack, with their
    own dtypes. ``stream`` is the CUDA stream that produced GPU tensors
    (-1: host tensors). Returns one Work per input."""
    return _C.submit(kind, list(inputs), list(names),
                     options(int(op), int(root), prescale, postscale, grouped=grouped,
                             stream=stream, splits=splits, process_set=process_set),
                     None if outputs is None else list(outputs))


def submit_one_host(kind: int, name: str, owner: Any, data_ptr: int, shape: Sequence[int],
                    dtype_code: int, op: int, root: int, prescale: float,
                    postscale: float, process_set: int = 0) -> Any:
    """Submits one contiguous host tensor by pointer, in place: ``owner``
    keeps the memory alive until the Work is released. Returns the Work."""
    if call_site.recording:
        return _C.submit(kind, (owner, data_ptr, shape, dtype_code), name,
                         options(op, root, prescale, postscale, in_place=True,
                                 process_set=process_set))
    return _C.submit(kind, (owner, data_ptr, shape, dtype_code), name,
                     _shared_options(op, root, prescale, postscale, True, False, -1, -1,
                                     process_set))


def submit_packed(owner: Any, name: str, dtype_code: int, inputs: Any,
                  outputs: list[int] | None, shapes: list[Sequence[int]], op: int,
                  prescale: float, postscale: float, process_set: int = 0,
                  stream: int = -1) -> Any:
    """Submits tensors of one dtype as one packed allreduce: ``inputs`` are
    host data pointers (``outputs`` too, or None for in place) or one
    flattened tensor of every member (``outputs`` None; ``stream`` is the
    CUDA stream that produced a GPU one), ``shapes`` the members'. One
    request and one Work however many tensors; ``owner`` keeps the memory
    alive until the Work is released. Returns the Work."""
    if call_site.recording:
        made = options(op, 0, prescale, postscale, in_place=True, grouped=True, stream=stream,
                       process_set=process_set)
    else:
        made = _shared_options(op, 0, prescale, postscale, True, True, stream, -1, process_set)
    return _C.submit_packed(owner, name, dtype_code, inputs, outputs, shapes, made)


def join() -> int:
    """Marks this rank as joined (see :func:`hora.join`); returns the rank
    that joined last."""
    return _C.join()
