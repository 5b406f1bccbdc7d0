"""Collectives on TensorFlow tensors with Horovod's names and semantics.

Every function here is collective: all ranks must call it, with matching
names (unnamed calls are matched by call order in eager mode and by the
reduced tensor's name inside ``tf.function``). They work eagerly and inside
``tf.function``; XLA compilation (``jit_compile=True``) is refused with a
clear error. Argument errors raise ``TypeError``/``ValueError`` at once;
ranks that disagree about a collective get :class:`hora.HoraMismatchError`
(eager) or a ``tf.errors.OpError`` carrying the same message (in a graph) on
every rank.

``allreduce`` (Sum and Average), ``grouped_allreduce``, ``allgather``,
``grouped_allgather``, ``broadcast``, ``alltoall``, ``reducescatter`` and
``grouped_reducescatter`` are differentiable, with Horovod's gradients
(allgather and broadcast average the incoming gradient over ranks,
reducescatter gathers it, times ``size()`` for Sum); they run collectives
themselves, so every rank must differentiate through them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from hora.common import ops as _ops
from hora.common._adapter.handles import wait_all
from hora.common.arguments import check_process_set, check_root, check_splits, resolve_op
from hora.common.basics import (
    Adasum, Average, ReduceOp, Sum, local_rank, local_size, rank, size)
from hora.common.exceptions import HoraTypeError
from hora.common.compression import Compressor
from hora.tensorflow._bridge import (
    check_tensor, check_tensors, collective_name, gathered_shape, grad_names, run)
from hora.tensorflow.compression import Compression

# a tf.Tensor, tf.Variable, NumPy array or anything tf.convert_to_tensor takes
TensorLike = Any

# hora runs every collective over all ranks; Horovod code that passes
# ``process_set=hvd.global_process_set`` keeps working.
global_process_set = None


def _scale_args(prescale_factor, postscale_factor):
    return float(prescale_factor), float(postscale_factor)


# --- allreduce ---------------------------------------------------------------

def _allreduce_now(tensors, names, op, prescale, postscale, grouped):
    """Allreduce of checked dense tensors as one graph node."""
    def reduce(*arrays):
        if grouped:
            return list(_ops.grouped_allreduce(list(arrays), names[0], op, prescale, postscale))
        return wait_all([_ops.allreduce_async(a, n, op, prescale, postscale)
                         for a, n in zip(arrays, names)])
    return run(reduce, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], names[0])


def _differentiable_allreduce(tensors, names, op, prescale, postscale, grouped):
    @tf.custom_gradient
    def forward(*xs):
        ys = _allreduce_now(list(xs), names, op, prescale, postscale, grouped)

        def backward(*dys):
            if op not in (Sum, Average):
                raise NotImplementedError(
                    f"allreduce '{names[0]}': the gradient of op {ReduceOp(op).name} is not "
                    f"implemented; only Sum and Average are differentiable")
            return _allreduce_now([tf.convert_to_tensor(d) for d in dys], grad_names(names), op,
                                  prescale, postscale, grouped)
        return ys, backward
    result = forward(*tensors)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _check_sparse(op, prescale, postscale):
    # Horovod's exceptions and words for what it cannot do with IndexedSlices
    if op == Adasum:
        raise NotImplementedError(
            "The Adasum reduction does not currently support sparse tensors. As a workaround "
            "please pass sparse_as_dense=True to DistributedOptimizer")
    if op not in (Sum, Average):
        raise NotImplementedError("Only Sum and Average ops are supported with tf.IndexedSlices")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("Pre/postscale_factor are not supported with tf.IndexedSlices")


def _average_values(values, op):
    # Horovod divides with `/`: integer values become float64
    if op != Average:
        return values
    return values / tf.cast(size(), values.dtype)


def _allreduce_sparse(slices, op, prescale, postscale, name):
    """An IndexedSlices allreduce: every rank's rows gathered, as Horovod does."""
    _check_sparse(op, prescale, postscale)
    values = allgather(slices.values, name=name + ".values")
    indices = allgather(slices.indices, name=name + ".indices")
    return tf.IndexedSlices(_average_values(values, op), indices,
                            dense_shape=slices.dense_shape)


def allreduce(tensor: TensorLike, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: type[Compressor] = Compression.none,
              op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None, process_set: None = None,
              ignore_name_scope: bool = False) -> tf.Tensor | tf.IndexedSlices:
    """Returns the reduction of ``tensor`` over all ranks.

    ``op`` is Average (the default), Sum, Min, Max or Product (``average``
    is the deprecated spelling). ``prescale_factor`` multiplies the input and
    ``postscale_factor`` the result (integers: in float64, truncated).
    ``compression`` casts for the wire and back. A ``tf.IndexedSlices`` is
    gathered from every rank (values divided by ``size()`` for Average).
    ``device_dense``/``device_sparse``/``ignore_name_scope`` are accepted for
    Horovod compatibility and ignored. Raises ``TypeError`` for an
    unsupported dtype, ``ValueError`` for a bad op or process set."""
    check_process_set(process_set, "allreduce")
    op = resolve_op(average, op, "allreduce")
    prescale, postscale = _scale_args(prescale_factor, postscale_factor)
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_sparse(tensor, op, prescale, postscale,
                                 collective_name(name, "Allreduce", tensor.values))
    tensor = check_tensor(tensor, "allreduce")
    name = collective_name(name, "Allreduce", tensor)
    compressed, ctx = compression.compress(tensor)
    reduced = _differentiable_allreduce([compressed], [name], op, prescale, postscale, False)[0]
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Iterable[TensorLike], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: type[Compressor] = Compression.none,
                      op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0, process_set: None = None,
                      name: str | None = None) -> list[tf.Tensor | tf.IndexedSlices]:
    """Allreduce of a list of tensors negotiated and fused as one unit;
    returns a list. Same arguments and errors as :func:`allreduce`."""
    check_process_set(process_set, "grouped_allreduce")
    op = resolve_op(average, op, "grouped_allreduce")
    prescale, postscale = _scale_args(prescale_factor, postscale_factor)
    tensors = list(tensors)
    if not tensors:
        return []
    dense_positions = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if len(dense_positions) < len(tensors):
        _check_sparse(op, prescale, postscale)
    dense = check_tensors([tensors[i] for i in dense_positions], "grouped_allreduce")
    results = list(tensors)
    base = collective_name(name, "GroupedAllreduce", dense[0] if dense else None)
    if dense:
        compressed = [compression.compress(t) for t in dense]
        reduced = _differentiable_allreduce([c for c, _ in compressed], [base], op, prescale,
                                            postscale, True)
        for position, value, (_, ctx) in zip(dense_positions, reduced, compressed):
            results[position] = compression.decompress(value, ctx)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = _allreduce_sparse(t, op, prescale, postscale, f"{base}.sparse.{i}")
    return results


# --- allgather ---------------------------------------------------------------

def _allgather_now(tensors, names):
    def gather(*arrays):
        return wait_all([_ops.allgather_async(a, n) for a, n in zip(arrays, names)])
    return run(gather, tensors, [t.dtype for t in tensors],
               [gathered_shape(t.shape) for t in tensors], names[0])


def _allgather_grad_now(grads, rows, names):
    """This rank's rows of the average of every rank's gradient (Horovod's
    allgather gradient)."""
    names = grad_names(names)

    def slice_sum(*arrays):
        grad_arrays, row_counts = arrays[:len(names)], arrays[len(names):]
        handles = [_ops.allreduce_async(g, n, Average) for g, n in zip(grad_arrays, names)]
        handles += [_ops.allgather_async(np.asarray(r, np.int64).reshape(1), n + ".rows")
                    for r, n in zip(row_counts, names)]
        results = wait_all(handles)
        sums, all_rows = results[:len(names)], results[len(names):]
        me = rank()
        out = []
        for total, counts in zip(sums, all_rows):
            start = int(counts[:me].sum())
            out.append(np.ascontiguousarray(total[start:start + int(counts[me])]))
        return out
    shapes = [tf.TensorShape([None]).concatenate(g.shape[1:]) if g.shape.rank else g.shape
              for g in grads]
    return run(slice_sum, list(grads) + list(rows), [g.dtype for g in grads], shapes, names[0])


def _differentiable_allgather(tensors, names):
    @tf.custom_gradient
    def forward(*xs):
        ys = _allgather_now(list(xs), names)

        def backward(*dys):
            rows = [tf.shape(x)[0] for x in xs]
            return _allgather_grad_now([tf.convert_to_tensor(d) for d in dys], rows, names)
        return ys, backward
    result = forward(*tensors)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _check_gatherable(tensor, what):
    if tensor.shape.rank == 0:
        raise ValueError(f"{what}: cannot gather a scalar; give the tensor at least one "
                         f"dimension (tf.reshape(x, [1]))")


def allgather(tensor: TensorLike, name: str | None = None, ignore_name_scope: bool = False,
              process_set: None = None) -> tf.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank
    order; the first dimension may differ between ranks, the others must
    not. Differentiable: the gradient is this rank's rows of the gradient
    averaged over ranks, as in Horovod."""
    check_process_set(process_set, "allgather")
    tensor = check_tensor(tensor, "allgather")
    _check_gatherable(tensor, "allgather")
    return _differentiable_allgather([tensor], [collective_name(name, "Allgather", tensor)])[0]


def grouped_allgather(tensors: Iterable[TensorLike], name: str | None = None,
                      process_set: None = None) -> list[tf.Tensor]:
    """:func:`allgather` of each tensor of a list, submitted together; returns a list."""
    check_process_set(process_set, "grouped_allgather")
    tensors = check_tensors(tensors, "grouped_allgather")
    if not tensors:
        return []
    for i, t in enumerate(tensors):
        _check_gatherable(t, f"grouped_allgather (tensor {i})")
    base = collective_name(name, "GroupedAllgather", tensors[0])
    return _differentiable_allgather(tensors, [f"{base}.{i}" for i in range(len(tensors))])


# --- broadcast ---------------------------------------------------------------

def _broadcast_now(tensors, root_rank, names):
    def cast(*arrays):
        return wait_all([_ops.broadcast_async(a, root_rank, n) for a, n in zip(arrays, names)])
    return run(cast, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], names[0])


def broadcast(tensor: TensorLike, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False, process_set: None = None) -> tf.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank. Differentiable: the
    root gets the average of every rank's gradient, the others zero, as in
    Horovod."""
    check_process_set(process_set, "broadcast")
    root_rank = check_root(root_rank, "broadcast")
    tensor = check_tensor(tensor, "broadcast")
    name = collective_name(name, "Broadcast", tensor)

    @tf.custom_gradient
    def forward(x):
        y = _broadcast_now([x], root_rank, [name])[0]

        def backward(dy):
            total = _allreduce_now([tf.convert_to_tensor(dy)], grad_names([name]), Average, 1.0,
                                   1.0, False)[0]
            # times zero rather than zeros_like: a graph would prune the
            # allreduce that zeros of a known shape do not depend on
            return total if rank() == root_rank else total * tf.zeros([], total.dtype)
        return y, backward
    return forward(tensor)


def broadcast_variables(variables: Iterable[tf.Variable], root_rank: int,
                        process_set: None = None, inplace: bool = True) -> tf.Operation | None:
    """Assigns ``root_rank``'s values to ``variables`` (a list of
    ``tf.Variable``) on every rank, in one submission. Returns ``None`` when
    eager and the grouped assign op inside ``tf.function``."""
    check_process_set(process_set, "broadcast_variables")
    root_rank = check_root(root_rank, "broadcast_variables")
    variables = list(variables)
    if not variables:
        return None
    values = check_tensors([v.read_value() if hasattr(v, "read_value") else v for v in variables],
                           "broadcast_variables")
    base = collective_name(None, "BroadcastVariables", values[0])
    results = _broadcast_now(values, root_rank, [f"{base}.{i}" for i in range(len(values))])
    assigns = [v.assign(r) for v, r in zip(variables, results)]
    return None if tf.executing_eagerly() else tf.group(*assigns)


def broadcast_(variables: Iterable[tf.Variable], root_rank: int, name: str | None = None,
               process_set: None = None) -> tf.Operation | None:
    """In-place broadcast of a list of variables (Horovod's spelling of
    :func:`broadcast_variables`)."""
    return broadcast_variables(variables, root_rank, process_set=process_set)


# --- alltoall ----------------------------------------------------------------

def _splits_tensor(splits, what):
    if splits is None:
        return None
    if isinstance(splits, (tf.Tensor, tf.Variable)):
        if not splits.dtype.is_integer:
            raise HoraTypeError(f"{what}: splits must hold integers, got {splits.dtype.name}")
        return tf.cast(tf.reshape(splits, [-1]), tf.int64)
    return tf.constant(check_splits(np.asarray(splits).reshape(-1).tolist(), what), tf.int64)


def _alltoall_now(x, splits, name):
    def exchange(array, *split_array):
        chosen = [int(s) for s in split_array[0]] if split_array else None
        output, received = _ops.alltoall(array, chosen, name)
        return [output, np.asarray(received, np.int32)]
    inputs = [x] if splits is None else [x, splits]
    return run(exchange, inputs, [x.dtype, tf.int32], [gathered_shape(x.shape), [size()]], name)


def alltoall(tensor: TensorLike, splits: TensorLike | None = None, name: str | None = None,
             ignore_name_scope: bool = False,
             process_set: None = None) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    """Sends ``splits[r]`` consecutive rows of ``tensor`` to rank ``r``.
    With ``splits``, returns ``(output, received_splits)``: the rows received
    from every rank in rank order, and how many came from each (int32).
    Without, the first dimension is divided evenly and only the output is
    returned, as in Horovod (``tf.errors.InvalidArgumentError`` when it does
    not divide). Differentiable in ``tensor``."""
    check_process_set(process_set, "alltoall")
    tensor = check_tensor(tensor, "alltoall")
    _check_gatherable(tensor, "alltoall")
    given = splits is not None
    splits = _splits_tensor(splits, "alltoall")
    name = collective_name(name, "Alltoall", tensor)

    @tf.custom_gradient
    def forward(x):
        output, received = _alltoall_now(x, splits, name)

        def backward(d_output, d_received=None):
            back, _ = _alltoall_now(tf.convert_to_tensor(d_output), tf.cast(received, tf.int64),
                                    grad_names([name])[0])
            return tf.reshape(back, tf.shape(x))
        return (output, received), backward
    output, received = forward(tensor)
    return (output, received) if given else output


# --- reducescatter -----------------------------------------------------------

def _reducescatter_now(tensors, names, op, prescale, postscale):
    def scatter(*arrays):
        return wait_all([_ops.reducescatter_async(a, n, op, prescale, postscale)
                         for a, n in zip(arrays, names)])
    return run(scatter, tensors, [t.dtype for t in tensors],
               [gathered_shape(t.shape) for t in tensors], names[0])


def _differentiable_reducescatter(tensors, names, op, prescale, postscale):
    if op not in (Sum, Average):
        # the core also supports Min/Max/Product; they have no gradient here
        return _reducescatter_now(tensors, names, op, prescale, postscale)

    @tf.custom_gradient
    def forward(*xs):
        ys = _reducescatter_now(list(xs), names, op, prescale, postscale)

        def backward(*dys):
            # Horovod's: the gathered gradient, times size() for Sum
            scale = prescale * postscale * (size() if op == Sum else 1)
            grads = _allgather_now([tf.convert_to_tensor(d) for d in dys], grad_names(names))
            return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in grads]
        return ys, backward
    result = forward(*tensors)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def reducescatter(tensor: TensorLike, name: str | None = None, op: ReduceOp | int = Average,
                  ignore_name_scope: bool = False, process_set: None = None,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces ``tensor`` over all ranks and returns this rank's block of
    rows (the first ``rows % size()`` ranks get one extra row).
    Differentiable for Sum and Average, with Horovod's gradient (the
    allgather of the gradient, times size() for Sum)."""
    check_process_set(process_set, "reducescatter")
    op = resolve_op(None, op, "reducescatter")
    tensor = check_tensor(tensor, "reducescatter")
    _check_gatherable(tensor, "reducescatter")
    prescale, postscale = _scale_args(prescale_factor, postscale_factor)
    return _differentiable_reducescatter([tensor], [collective_name(name, "Reducescatter", tensor)],
                                         op, prescale, postscale)[0]


def grouped_reducescatter(tensors: Iterable[TensorLike], name: str | None = None,
                          op: ReduceOp | int = Average, process_set: None = None,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[tf.Tensor]:
    """:func:`reducescatter` of each tensor of a list, submitted together."""
    check_process_set(process_set, "grouped_reducescatter")
    op = resolve_op(None, op, "grouped_reducescatter")
    tensors = check_tensors(tensors, "grouped_reducescatter")
    if not tensors:
        return []
    for i, t in enumerate(tensors):
        _check_gatherable(t, f"grouped_reducescatter (tensor {i})")
    prescale, postscale = _scale_args(prescale_factor, postscale_factor)
    base = collective_name(name, "GroupedReducescatter", tensors[0])
    return _differentiable_reducescatter(tensors, [f"{base}.{i}" for i in range(len(tensors))],
                                         op, prescale, postscale)


# --- synchronization and topology as ops --------------------------------------

def _scalar_op(fn, name):
    return run(lambda: [np.asarray(fn(), np.int32)], [], [tf.int32], [[]], name)[0]


def join() -> tf.Tensor:
    """Marks this rank as out of data; until every rank has joined it takes
    part in the others' allreduces with neutral values. Returns (as an int32
    tensor) the rank that joined last."""
    return _scalar_op(_ops.join, "HoraJoin")


def barrier(process_set: None = None) -> tf.Tensor:
    """Returns once every rank has reached the barrier (an int32 zero tensor)."""
    check_process_set(process_set, "barrier")

    def wait():
        _ops.barrier()
        return 0
    return _scalar_op(wait, "HoraBarrier")


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks, as an int32 tensor read when the op runs."""
    return _scalar_op(size, name or "HoraSize")


def rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank, as an int32 tensor."""
    return _scalar_op(rank, name or "HoraRank")


def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor."""
    return _scalar_op(local_size, name or "HoraLocalSize")


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 tensor."""
    return _scalar_op(local_rank, name or "HoraLocalRank")
