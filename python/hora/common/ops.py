"""Collectives on NumPy arrays (and anything exposing the buffer protocol).

Every function here is collective: each rank must call it with a matching
name (or, for unnamed calls, in the same order). Results equal a NumPy
reduction over all ranks' inputs. Argument errors raise ``ValueError`` or
``TypeError`` at once; disagreements between ranks raise
:class:`~hora.HoraMismatchError` on every rank.
"""

import itertools
import pickle
import threading

import numpy as np

from hora._loader import _C
from hora.common import call_site
from hora.common.basics import ReduceOp

_KIND_ALLREDUCE = 0
_KIND_ALLGATHER = 1
_KIND_BROADCAST = 2
_KIND_ALLTOALL = 3
_KIND_REDUCESCATTER = 4
_KIND_BARRIER = 5
_BFLOAT16 = _C.DTYPES["bfloat16"]

_counter_lock = threading.Lock()
_counters = {}


def _auto_name(kind):
    # Unnamed collectives match across ranks by call order, as in Horovod.
    with _counter_lock:
        counter = _counters.setdefault(kind, itertools.count())
        return f"{kind}.noname.{next(counter)}"


def _check_name(name, kind):
    if name is None:
        return _auto_name(kind)
    if not isinstance(name, str):
        raise TypeError(f"{kind}: name must be a str, got {type(name).__name__}")
    return name


# ReduceOp members hash and compare like their values, so one lookup takes
# both (an enum construction costs as much as the rest of a submission).
_OP_VALUES = {int(o): int(o) for o in ReduceOp}


def _check_op(op):
    value = _OP_VALUES.get(op) if isinstance(op, int) else None
    if value is None:
        raise ValueError(f"unknown reduce op {op!r}; use hora.Sum, Average, Min, Max or Product")
    return value


def _as_array(tensor, what):
    array = np.asarray(tensor)
    if array.dtype == object:
        raise TypeError(f"{what}: cannot reduce Python objects; use broadcast_object/allgather_object")
    return array


def _wire(array):
    """The array as the core sees it: NumPy has no native bfloat16, so an
    ml_dtypes bfloat16 array travels as its 16 bits plus a dtype tag."""
    dtype = getattr(array, "dtype", None)
    # dtype.kind is cheap and "V" is rare; dtype.name is built on every access
    if getattr(dtype, "kind", None) == "V" and dtype.name == "bfloat16":
        return array.view(np.int16), _BFLOAT16
    return array, -1


def _check_writable_array(tensor, kind, name):
    if not isinstance(tensor, np.ndarray) and not hasattr(tensor, "__dlpack__"):
        raise TypeError(f"{kind} '{name}' writes its result into its input, which must be a "
                        f"writable array, got {type(tensor).__name__}")


class Handle:
    """A collective in flight. Pass it to :func:`poll` or :func:`synchronize`."""

    __slots__ = ("_works", "_finish", "_result", "_error", "_done")

    def __init__(self, works, finish):
        self._works = works
        self._finish = finish
        self._done = False
        self._result = None
        self._error = None

    def _wait(self):
        if not self._done:
            try:
                for work in self._works:
                    work.wait()
                self._result = self._finish(self._works)
            except BaseException as error:
                self._error = error
                raise
            finally:
                for work in self._works:
                    work.release()
                self._done = True
        if self._error is not None:
            raise self._error
        return self._result

    def _poll(self):
        return self._done or all(work.poll() for work in self._works)


class _OneHandle(Handle):
    """A handle on one core Work whose result object is known when it is
    submitted (an in-place collective, or one into a caller's output): the
    per-gradient path, without a list or a finishing closure. ``_works``
    holds that one Work itself."""

    __slots__ = ()

    def __init__(self, work, result):
        self._works = work
        self._finish = None
        self._result = result
        self._done = False
        self._error = None

    def _wait(self):
        if not self._done:
            try:
                self._works.wait_release()  # gives up the GIL while it waits
            except BaseException as error:
                self._error = error
                raise
            finally:
                # only now: another thread polling meanwhile must not see
                # the result as ready while the engine still writes it
                self._done = True
        if self._error is not None:
            raise self._error
        return self._result

    def _poll(self):
        return self._done or self._works.poll()


def poll(handle):
    """True once the collective behind ``handle`` has finished (never blocks)."""
    return handle._poll()


def synchronize(handle):
    """Waits for ``handle`` and returns its result; raises the collective's error."""
    return handle._wait()


def _submit(kind, names, inputs, outputs=None, op=1, root=0, prescale=1.0, postscale=1.0,
            splits=None, grouped=False):
    if len(inputs) == 1 and (outputs is None or outputs[0] is inputs[0]):
        # One tensor (in place or not): the common case, without the loops.
        wire, dtype = _wire(inputs[0])
        return _C.submit(kind, names, [wire], None if outputs is None else [wire], op, root,
                         float(prescale), float(postscale), splits, [dtype], grouped,
                         call_site.describe())
    wire_inputs, dtypes = [], []
    for array in inputs:
        wire, dtype = _wire(array)
        wire_inputs.append(wire)
        dtypes.append(dtype)
    wire_outputs = None
    if outputs is not None:
        wire_outputs = [w if o is i else _wire(o)[0]
                        for w, o, i in zip(wire_inputs, outputs, inputs)]
    return _C.submit(kind, names, wire_inputs, wire_outputs, op, root, float(prescale),
                     float(postscale), splits, dtypes, grouped, call_site.describe())


def _owned_result(dtype):
    def finish(works):
        work = works[0]
        return np.frombuffer(work.result_buffer(), dtype=dtype).reshape(work.output_shape)
    return finish


def _returns(values):
    return lambda works: values


# --- allreduce ---------------------------------------------------------------

def allreduce_async(tensor, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                    postscale_factor=1.0):
    """Starts an allreduce and returns a :class:`Handle`; ``synchronize`` gives
    a new array holding the reduction of ``tensor`` over all ranks."""
    name = _check_name(name, "allreduce")
    x = _as_array(tensor, f"allreduce '{name}'")
    out = np.empty_like(x)
    works = _submit(_KIND_ALLREDUCE, [name], [x], [out], _check_op(op), 0, prescale_factor,
                    postscale_factor)
    return _OneHandle(works[0], out)


def allreduce(tensor, name=None, op=ReduceOp.Average, prescale_factor=1.0, postscale_factor=1.0):
    """Reduces ``tensor`` over all ranks with ``op`` (Average by default) and
    returns the result as a new array. ``prescale_factor`` multiplies the
    input before the reduction and ``postscale_factor`` the result after it
    (floating-point types only). float16/bfloat16 accumulate in float32."""
    return synchronize(allreduce_async(tensor, name, op, prescale_factor, postscale_factor))


def allreduce_async_(tensor, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                     postscale_factor=1.0):
    """In-place :func:`allreduce_async`: the result overwrites ``tensor``, which
    must be a writable contiguous array."""
    name = _check_name(name, "allreduce")
    _check_writable_array(tensor, "allreduce_", name)
    wire, dtype = _wire(tensor)
    work = _C.submit_one(_KIND_ALLREDUCE, name, wire, True, _check_op(op), float(prescale_factor),
                         float(postscale_factor), dtype, call_site.describe())
    return _OneHandle(work, tensor)


def allreduce_(tensor, name=None, op=ReduceOp.Average, prescale_factor=1.0, postscale_factor=1.0):
    """In-place :func:`allreduce`; returns ``tensor``."""
    return synchronize(allreduce_async_(tensor, name, op, prescale_factor, postscale_factor))


def _group_names(name, count, kind):
    base = _check_name(name, kind)
    return [f"{base}.{i}" for i in range(count)]


def grouped_allreduce_async(tensors, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                            postscale_factor=1.0):
    """Starts an allreduce of a list of tensors that are negotiated and fused
    as one unit; ``synchronize`` gives a list of new arrays."""
    tensors = list(tensors)
    names = _group_names(name, len(tensors), "grouped_allreduce")
    inputs = [_as_array(t, f"grouped_allreduce '{n}'") for t, n in zip(tensors, names)]
    outputs = [np.empty_like(x) for x in inputs]
    works = _submit(_KIND_ALLREDUCE, names, inputs, outputs, _check_op(op), 0, prescale_factor,
                    postscale_factor, grouped=True)
    return Handle(works, _returns(outputs))


def grouped_allreduce(tensors, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                      postscale_factor=1.0):
    """Allreduce of a list of tensors as one fused unit; returns a list."""
    return synchronize(grouped_allreduce_async(tensors, name, op, prescale_factor, postscale_factor))


def grouped_allreduce_async_(tensors, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                             postscale_factor=1.0):
    """In-place :func:`grouped_allreduce_async`."""
    tensors = list(tensors)
    names = _group_names(name, len(tensors), "grouped_allreduce")
    for tensor, tensor_name in zip(tensors, names):
        _check_writable_array(tensor, "grouped_allreduce_", tensor_name)
    works = _submit(_KIND_ALLREDUCE, names, tensors, tensors, _check_op(op), 0, prescale_factor,
                    postscale_factor, grouped=True)
    return Handle(works, _returns(tensors))


def grouped_allreduce_(tensors, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                       postscale_factor=1.0):
    """In-place :func:`grouped_allreduce`; returns the list of tensors."""
    return synchronize(grouped_allreduce_async_(tensors, name, op, prescale_factor, postscale_factor))


# --- allgather, broadcast, alltoall, reducescatter ----------------------------

def allgather_async(tensor, name=None):
    """Starts an allgather; see :func:`allgather`."""
    name = _check_name(name, "allgather")
    x = _as_array(tensor, f"allgather '{name}'")
    works = _submit(_KIND_ALLGATHER, [name], [x])
    return Handle(works, _owned_result(x.dtype))


def allgather(tensor, name=None):
    """Concatenates every rank's ``tensor`` along the first dimension, in rank
    order. The first dimension may differ between ranks; the others must not."""
    return synchronize(allgather_async(tensor, name))


def broadcast_async(tensor, root_rank, name=None):
    """Starts a broadcast; see :func:`broadcast`."""
    name = _check_name(name, "broadcast")
    x = _as_array(tensor, f"broadcast '{name}'")
    out = np.empty_like(x)
    works = _submit(_KIND_BROADCAST, [name], [x], [out], root=int(root_rank))
    return _OneHandle(works[0], out)


def broadcast(tensor, root_rank, name=None):
    """Returns a new array holding ``root_rank``'s ``tensor`` on every rank."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_async_(tensor, root_rank, name=None):
    """In-place :func:`broadcast_async`."""
    name = _check_name(name, "broadcast")
    _check_writable_array(tensor, "broadcast_", name)
    works = _submit(_KIND_BROADCAST, [name], [tensor], [tensor], root=int(root_rank))
    return _OneHandle(works[0], tensor)


def broadcast_(tensor, root_rank, name=None):
    """Overwrites ``tensor`` with ``root_rank``'s values; returns ``tensor``."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def alltoall_async(tensor, splits=None, name=None):
    """Starts an alltoall; see :func:`alltoall`."""
    name = _check_name(name, "alltoall")
    x = _as_array(tensor, f"alltoall '{name}'")
    if splits is not None:
        splits = [int(s) for s in np.asarray(splits).reshape(-1)]
    works = _submit(_KIND_ALLTOALL, [name], [x], splits=splits)

    def finish(works):
        received = np.asarray(works[0].received_splits, dtype=np.int64)
        return _owned_result(x.dtype)(works), received
    return Handle(works, finish)


def alltoall(tensor, splits=None, name=None):
    """Sends ``splits[r]`` consecutive rows of ``tensor`` to rank ``r`` and
    returns ``(output, received_splits)``: the rows received from every rank,
    concatenated in rank order, and how many came from each. Without
    ``splits`` the first dimension is divided evenly."""
    return synchronize(alltoall_async(tensor, splits, name))


def reducescatter_async(tensor, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts a reducescatter; see :func:`reducescatter`."""
    name = _check_name(name, "reducescatter")
    x = _as_array(tensor, f"reducescatter '{name}'")
    works = _submit(_KIND_REDUCESCATTER, [name], [x], op=_check_op(op), prescale=prescale_factor,
                    postscale=postscale_factor)
    return Handle(works, _owned_result(x.dtype))


def reducescatter(tensor, name=None, op=ReduceOp.Average, prescale_factor=1.0,
                  postscale_factor=1.0):
    """Reduces ``tensor`` over all ranks and returns this rank's block of rows.
    When the first dimension does not divide evenly, the first
    ``rows % size()`` ranks get one extra row."""
    return synchronize(reducescatter_async(tensor, name, op, prescale_factor, postscale_factor))


# --- synchronization and objects ---------------------------------------------

def barrier():
    """Returns once every rank has called ``barrier``."""
    name = _auto_name("barrier")
    works = _submit(_KIND_BARRIER, [name], [np.zeros(0, np.uint8)])
    synchronize(Handle(works, _returns(None)))


def join():
    """Marks this rank as out of data. Until every rank has joined, this rank
    takes part in other ranks' allreduces with neutral values (zeros for sums,
    so an Average is taken over the ranks that contributed). Returns the rank
    that joined last."""
    return _C.join()


def broadcast_object(obj, root_rank=0, name=None):
    """Returns ``root_rank``'s picklable ``obj`` on every rank."""
    from hora.common.basics import rank
    name = _check_name(name, "broadcast_object")
    payload = np.frombuffer(pickle.dumps(obj), np.uint8) if rank() == root_rank else None
    length = np.array([0 if payload is None else payload.size], np.int64)
    broadcast_(length, root_rank, name + ".length")
    if payload is None:
        payload = np.empty(int(length[0]), np.uint8)
    else:
        payload = payload.copy()
    broadcast_(payload, root_rank, name + ".data")
    return obj if rank() == root_rank else pickle.loads(payload.tobytes())


def allgather_object(obj, name=None):
    """Returns the list of every rank's picklable ``obj``, in rank order."""
    name = _check_name(name, "allgather_object")
    payload = np.frombuffer(pickle.dumps(obj), np.uint8)
    lengths = allgather(np.array([payload.size], np.int64), name + ".length")
    data = allgather(payload, name + ".data").tobytes()
    result, offset = [], 0
    for length in lengths:
        result.append(pickle.loads(data[offset:offset + int(length)]))
        offset += int(length)
    return result
