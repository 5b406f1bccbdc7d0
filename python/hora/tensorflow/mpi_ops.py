"""Collectives on TensorFlow tensors with Horovod's names and semantics.

Every function here is collective: all ranks must call it, with matching
names (unnamed calls are matched by call order in eager mode and by the
reduced tensor's name inside ``tf.function``). They work eagerly and inside
``tf.function``; XLA compilation (``jit_compile=True``) is refused with a
clear error. Argument errors raise ``TypeError``/``ValueError`` at once;
ranks that disagree about a collective get ``tf.errors.FailedPreconditionError``
(also :class:`hora.HoraMismatchError`) on every rank, eagerly and from a
``tf.function`` or a ``tf.data`` map (not from a TF1 ``Session``, where it
is a ``tf.errors.UnknownError`` with the same message); an argument refused
when the collective runs gives ``tf.errors.InvalidArgumentError``.

``allreduce`` (Sum and Average), ``grouped_allreduce``, ``allgather``,
``grouped_allgather``, ``broadcast``, ``alltoall``, ``reducescatter`` and
``grouped_reducescatter`` are differentiable, with Horovod's gradients
(allgather and broadcast average the incoming gradient over ranks,
reducescatter gathers it, times ``size()`` for Sum); they run collectives
themselves, so every rank must differentiate through them.

Process sets: every collective takes ``process_set=`` (a
:class:`hora.ProcessSet` registered by ``init`` or ``add_process_set``;
the global set by default) and then runs among that set's ranks only, as in
Horovod: an Average divides by the set's size, ``root_rank`` stays a global
rank, alltoall splits have one entry per member, and the gradients of the
collectives run in the same set. Only members may call them; a process
outside the set gets ``tf.errors.InvalidArgumentError``, which is also a
``ValueError`` (inside ``tf.function``, when the function is traced).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import tensorflow as tf

from hora._loader import _C
from hora.common import ops as _ops
from hora.common._adapter.handles import wait_all
from hora.common._adapter.checks import check_root, check_splits, process_set_id, resolve_op
from hora.common.basics import (  # noqa: F401 (Horovod's tensorflow.mpi_ops has them all)
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, ccl_built, cross_rank, cross_size,
    cuda_built, ddl_built, gloo_built, gloo_enabled, init, is_homogeneous, is_initialized,
    local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
    rocm_built, shutdown, size)
from hora.common.compression import Compressor
from hora.common.exceptions import HoraInvalidArgumentError, HoraTypeError
# add_process_set and remove_process_set are here too, as in Horovod's mpi_ops
from hora.common.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set, set_rank, set_size)
from hora.tensorflow._bridge import (
    as_tf_error, check_tensor, check_tensors, collective_name, gathered_shape, grad_names, run,
    unconverted)
from hora.tensorflow.compression import Compression
from hora.tensorflow import _exact_gradients

# a tf.Tensor, tf.Variable, NumPy array or anything tf.convert_to_tensor takes
TensorLike = Any


def _scale_args(prescale_factor, postscale_factor):
    return float(prescale_factor), float(postscale_factor)


def _checked_set(process_set, what):
    """``process_set`` (a registered :class:`hora.ProcessSet`; None is the
    global set) for a collective called ``what``. Building a graph, a
    process outside the set is refused here, when the function is traced
    (``tf.errors.InvalidArgumentError``, also a ``ValueError``), with the
    core's own words; eagerly the core refuses it at submission."""
    if process_set is None or process_set is global_process_set:
        return global_process_set
    ident = process_set_id(process_set, what)  # refuses a bad or unregistered set
    if not tf.executing_eagerly():
        _check_call(ident, None, what)
    return process_set


def _check_call(ident, root_rank, what):
    try:
        _C.check_process_set_call(ident, root_rank, what)
    except HoraInvalidArgumentError as error:
        raise as_tf_error(error) from None


# --- allreduce ---------------------------------------------------------------

@unconverted
def _allreduce_now(tensors, names, op, prescale, postscale, grouped, ps=global_process_set):
    """Allreduce of checked dense tensors as one graph node, in process set ``ps``."""
    def reduce(*arrays):
        if grouped:
            return list(_ops.grouped_allreduce(list(arrays), names[0], op, prescale, postscale,
                                               process_set=ps))
        return wait_all([_ops.allreduce_async(a, n, op, prescale, postscale, process_set=ps)
                         for a, n in zip(arrays, names)])
    return run(reduce, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], names[0])


def _differentiable_allreduce(tensors, names, op, prescale, postscale, grouped, ps):
    @tf.custom_gradient
    def forward(*xs):
        ys = _allreduce_now(list(xs), names, op, prescale, postscale, grouped, ps)

        def backward(*dys):
            dys = [tf.convert_to_tensor(d) for d in dys]
            if op in (Min, Max, Product) and _C.exact_reduce_gradients():
                return _exact_gradients.allreduce_gradients(
                    dys, xs, grad_names(names), op, prescale, postscale, ps, _now())
            # Horovod's: the same allreduce of the gradients
            return _allreduce_now(dys, grad_names(names), op, prescale, postscale, grouped, ps)
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


def _average_values(values, op, ps):
    # Horovod divides with `/`: integer values become float64
    if op != Average:
        return values
    return values / tf.cast(set_size(ps), values.dtype)


def _allreduce_sparse(slices, op, prescale, postscale, name, ps=global_process_set):
    """An IndexedSlices allreduce: every rank's rows gathered (the rows of
    the ranks of ``ps``), as Horovod does."""
    _check_sparse(op, prescale, postscale)
    values = allgather(slices.values, name=name + ".values", process_set=ps)
    indices = allgather(slices.indices, name=name + ".indices", process_set=ps)
    return tf.IndexedSlices(_average_values(values, op, ps), indices,
                            dense_shape=slices.dense_shape)


def allreduce(tensor: TensorLike, average: bool | None = None, device_dense: str = "",
              device_sparse: str = "", compression: type[Compressor] = Compression.none,
              op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor | tf.IndexedSlices:
    """Returns the reduction of ``tensor`` over all ranks (over the ranks of
    ``process_set``, where an Average divides by the set's size).

    ``op`` is Average (the default), Sum, Min, Max or Product (``average``
    is the deprecated spelling). ``prescale_factor`` multiplies the input and
    ``postscale_factor`` the result (integers: in float64, truncated).
    ``compression`` casts for the wire and back. A ``tf.IndexedSlices`` is
    gathered from every rank (values divided by the number of ranks for
    Average).
    ``device_dense``/``device_sparse``/``ignore_name_scope`` are accepted for
    Horovod compatibility and ignored. Raises ``TypeError`` for an
    unsupported dtype or process set, ``ValueError`` for a bad op or an
    unregistered process set."""
    ps = _checked_set(process_set, "allreduce")
    op = resolve_op(average, op, "allreduce")
    prescale, postscale = _scale_args(prescale_factor, postscale_factor)
    ident = ps.process_set_id
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_sparse(tensor, op, prescale, postscale,
                                 collective_name(name, "Allreduce", tensor.values, ident), ps)
    tensor = check_tensor(tensor, "allreduce")
    name = collective_name(name, "Allreduce", tensor, ident)
    compressed, ctx = compression.compress(tensor)
    reduced = _differentiable_allreduce([compressed], [name], op, prescale, postscale, False,
                                        ps)[0]
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors: Iterable[TensorLike], average: bool | None = None,
                      device_dense: str = "", device_sparse: str = "",
                      compression: type[Compressor] = Compression.none,
                      op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False,
                      name: str | None = None) -> list[tf.Tensor | tf.IndexedSlices]:
    """Allreduce of a list of tensors negotiated and fused as one unit;
    returns a list. Same arguments and errors as :func:`allreduce`
    (``ignore_name_scope`` is Horovod's, without effect: names do not
    depend on name scopes here)."""
    ps = _checked_set(process_set, "grouped_allreduce")
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
    base = collective_name(name, "GroupedAllreduce", dense[0] if dense else None,
                           ps.process_set_id)
    if dense:
        compressed = [compression.compress(t) for t in dense]
        reduced = _differentiable_allreduce([c for c, _ in compressed], [base], op, prescale,
                                            postscale, True, ps)
        for position, value, (_, ctx) in zip(dense_positions, reduced, compressed):
            results[position] = compression.decompress(value, ctx)
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            results[i] = _allreduce_sparse(t, op, prescale, postscale, f"{base}.sparse.{i}", ps)
    return results


# --- allgather ---------------------------------------------------------------

@unconverted
def _allgather_now(tensors, names, ps=global_process_set):
    def gather(*arrays):
        return wait_all([_ops.allgather_async(a, n, process_set=ps)
                         for a, n in zip(arrays, names)])
    return run(gather, tensors, [t.dtype for t in tensors],
               [gathered_shape(t.shape) for t in tensors], names[0])


@unconverted
def _allgather_grad_now(grads, rows, names, ps):
    """This rank's rows of the average of every rank's gradient (Horovod's
    allgather gradient), over the ranks of ``ps``."""
    names = grad_names(names)

    def slice_sum(*arrays):
        grad_arrays, row_counts = arrays[:len(names)], arrays[len(names):]
        handles = [_ops.allreduce_async(g, n, Average, process_set=ps)
                   for g, n in zip(grad_arrays, names)]
        handles += [_ops.allgather_async(np.asarray(r, np.int64).reshape(1), n + ".rows",
                                         process_set=ps)
                    for r, n in zip(row_counts, names)]
        results = wait_all(handles)
        sums, all_rows = results[:len(names)], results[len(names):]
        me = set_rank(ps)
        out = []
        for total, counts in zip(sums, all_rows):
            start = int(counts[:me].sum())
            out.append(np.ascontiguousarray(total[start:start + int(counts[me])]))
        return out
    shapes = [tf.TensorShape([None]).concatenate(g.shape[1:]) if g.shape.rank else g.shape
              for g in grads]
    return run(slice_sum, list(grads) + list(rows), [g.dtype for g in grads], shapes, names[0])


def _differentiable_allgather(tensors, names, ps):
    @tf.custom_gradient
    def forward(*xs):
        ys = _allgather_now(list(xs), names, ps)

        def backward(*dys):
            rows = [tf.shape(x)[0] for x in xs]
            return _allgather_grad_now([tf.convert_to_tensor(d) for d in dys], rows, names, ps)
        return ys, backward
    result = forward(*tensors)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _check_gatherable(tensor, what):
    if tensor.shape.rank == 0:
        raise ValueError(f"{what}: cannot gather a scalar; give the tensor at least one "
                         f"dimension (tf.reshape(x, [1]))")


def allgather(tensor: TensorLike, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenates every rank's ``tensor`` along the first dimension, in rank
    order (the ranks of ``process_set``); the first dimension may differ
    between ranks, the others must not. Differentiable: the gradient is this
    rank's rows of the gradient averaged over the ranks, as in Horovod."""
    ps = _checked_set(process_set, "allgather")
    tensor = check_tensor(tensor, "allgather")
    _check_gatherable(tensor, "allgather")
    name = collective_name(name, "Allgather", tensor, ps.process_set_id)
    return _differentiable_allgather([tensor], [name], ps)[0]


def grouped_allgather(tensors: Iterable[TensorLike], name: str | None = None,
                      ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """:func:`allgather` of each tensor of a list, submitted together; returns a list."""
    ps = _checked_set(process_set, "grouped_allgather")
    checked = check_tensors(tensors, "grouped_allgather")
    if not checked:
        return []
    for i, t in enumerate(checked):
        _check_gatherable(t, f"grouped_allgather (tensor {i})")
    base = collective_name(name, "GroupedAllgather", checked[0], ps.process_set_id)
    return _differentiable_allgather(checked, [f"{base}.{i}" for i in range(len(checked))], ps)


# --- broadcast ---------------------------------------------------------------

@unconverted
def _broadcast_now(tensors, root_rank, names, ps=global_process_set):
    def cast(*arrays):
        return wait_all([_ops.broadcast_async(a, root_rank, n, process_set=ps)
                         for a, n in zip(arrays, names)])
    return run(cast, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], names[0])


def _check_root_in_set(root_rank, ps, what):
    """Refuses a root outside the set at the call (when traced, in a graph),
    with the classes and words of the core's own check, which runs eagerly."""
    if ps is not global_process_set and isinstance(root_rank, int):
        _check_call(ps.process_set_id, root_rank, what)


def broadcast(tensor: TensorLike, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Returns ``root_rank``'s ``tensor`` on every rank (of ``process_set``;
    ``root_rank`` is a global rank, which must be in the set).
    Differentiable: the root gets the average of every rank's gradient, the
    others zero, as in Horovod."""
    ps = _checked_set(process_set, "broadcast")
    root_rank = check_root(root_rank, "broadcast")
    _check_root_in_set(root_rank, ps, "broadcast")
    tensor = check_tensor(tensor, "broadcast")
    name = collective_name(name, "Broadcast", tensor, ps.process_set_id)

    @tf.custom_gradient
    def forward(x):
        y = _broadcast_now([x], root_rank, [name], ps)[0]

        def backward(dy):
            total = _allreduce_now([tf.convert_to_tensor(dy)], grad_names([name]), Average, 1.0,
                                   1.0, False, ps)[0]
            # times zero rather than zeros_like: a graph would prune the
            # allreduce that zeros of a known shape do not depend on
            return total if rank() == root_rank else total * tf.zeros([], total.dtype)
        return y, backward
    return forward(tensor)


def _broadcast_variables(variables, root_rank, name, process_set, what):
    """Assigns ``root_rank``'s values to ``variables``; returns the
    variables and their assign ops (none when there are no variables)."""
    ps = _checked_set(process_set, what)
    root_rank = check_root(root_rank, what)
    _check_root_in_set(root_rank, ps, what)
    variables = list(variables)
    if not variables:
        return [], []
    values = check_tensors([v.read_value() if hasattr(v, "read_value") else v for v in variables],
                           what)
    base = collective_name(name, "BroadcastVariables", values[0], ps.process_set_id)
    results = _broadcast_now(values, root_rank, [f"{base}.{i}" for i in range(len(values))], ps)
    return variables, [v.assign(r) for v, r in zip(variables, results)]


def broadcast_variables(variables: Iterable[tf.Variable], root_rank: int,
                        process_set: ProcessSet = global_process_set,
                        inplace: bool = True) -> tf.Operation | None:
    """Assigns ``root_rank``'s values to ``variables`` (a list of
    ``tf.Variable``) on every rank (of ``process_set``; ``root_rank`` is a
    global rank in it), in one submission. Returns ``None`` when eager and
    the grouped assign op inside ``tf.function``, as Horovod does."""
    _, assigns = _broadcast_variables(variables, root_rank, None, process_set,
                                      "broadcast_variables")
    if not assigns or tf.executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_(variables: Iterable[tf.Variable], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """In-place broadcast of a list of variables: assigns ``root_rank``'s
    values to them on every rank (of ``process_set``), in one submission
    (``name`` names the collectives). Returns, as Horovod does, the list of
    the variables' values after the broadcast (``v, = hvd.broadcast_([var],
    0)``), eagerly and inside ``tf.function``, where reading them waits for
    the assignments."""
    variables, assigns = _broadcast_variables(variables, root_rank, name, process_set,
                                              "broadcast_")
    if tf.executing_eagerly():
        return [v.read_value() for v in variables]
    with tf.control_dependencies(assigns):
        return [v.read_value() for v in variables]


# --- alltoall ----------------------------------------------------------------

def _splits_tensor(splits, what):
    if splits is None:
        return None
    if isinstance(splits, (tf.Tensor, tf.Variable)):
        if not splits.dtype.is_integer:
            raise HoraTypeError(f"{what}: splits must hold integers, got {splits.dtype.name}")
        return tf.cast(tf.reshape(splits, [-1]), tf.int64)
    return tf.constant(check_splits(np.asarray(splits).reshape(-1).tolist(), what), tf.int64)


@unconverted
def _alltoall_now(x, splits, name, ps):
    def exchange(array, *split_array):
        chosen = [int(s) for s in split_array[0]] if split_array else None
        output, received = _ops.alltoall(array, chosen, name, process_set=ps)
        return [output, np.asarray(received, np.int32)]
    inputs = [x] if splits is None else [x, splits]
    return run(exchange, inputs, [x.dtype, tf.int32],
               [gathered_shape(x.shape), [set_size(ps)]], name)


def alltoall(tensor: TensorLike, splits: TensorLike | None = None, name: str | None = None,
             ignore_name_scope: bool = False, process_set: ProcessSet = global_process_set
             ) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    """Sends ``splits[r]`` consecutive rows of ``tensor`` to rank ``r``.
    With ``splits``, returns ``(output, received_splits)``: the rows received
    from every rank in rank order, and how many came from each (int32).
    Without, the first dimension is divided evenly and only the output is
    returned, as in Horovod (``tf.errors.InvalidArgumentError`` when it does
    not divide). With ``process_set``, ``r`` counts the set's members in
    rank order (``splits`` has one entry per member). Differentiable in
    ``tensor``."""
    ps = _checked_set(process_set, "alltoall")
    tensor = check_tensor(tensor, "alltoall")
    _check_gatherable(tensor, "alltoall")
    given = splits is not None
    splits = _splits_tensor(splits, "alltoall")
    name = collective_name(name, "Alltoall", tensor, ps.process_set_id)

    @tf.custom_gradient
    def forward(x):
        output, received = _alltoall_now(x, splits, name, ps)

        def backward(d_output, d_received=None):
            back, _ = _alltoall_now(tf.convert_to_tensor(d_output), tf.cast(received, tf.int64),
                                    grad_names([name])[0], ps)
            return tf.reshape(back, tf.shape(x))
        return (output, received), backward
    output, received = forward(tensor)
    return (output, received) if given else output


# --- reducescatter -----------------------------------------------------------

@unconverted
def _reducescatter_now(tensors, names, op, prescale, postscale, ps):
    def scatter(*arrays):
        return wait_all([_ops.reducescatter_async(a, n, op, prescale, postscale, process_set=ps)
                         for a, n in zip(arrays, names)])
    return run(scatter, tensors, [t.dtype for t in tensors],
               [gathered_shape(t.shape) for t in tensors], names[0])


def _differentiable_reducescatter(tensors, names, op, prescale, postscale, ps):
    @tf.custom_gradient
    def forward(*xs):
        ys = _reducescatter_now(list(xs), names, op, prescale, postscale, ps)

        def backward(*dys):
            if op in (Min, Max, Product) and _C.exact_reduce_gradients():
                return _exact_gradients.reducescatter_gradients(
                    [tf.convert_to_tensor(d) for d in dys], xs, grad_names(names), op, prescale,
                    postscale, ps, _now())
            # Horovod's: the gathered gradient, times the set's size for Sum
            scale = prescale * postscale * (set_size(ps) if op == Sum else 1)
            grads = _allgather_now([tf.convert_to_tensor(d) for d in dys], grad_names(names), ps)
            return [g * tf.cast(scale, g.dtype) if scale != 1.0 else g for g in grads]
        return ys, backward
    result = forward(*tensors)
    return list(result) if isinstance(result, (list, tuple)) else [result]


def reducescatter(tensor: TensorLike, device_dense: str = "",
                  compression: type[Compressor] = Compression.none,
                  op: ReduceOp | int = Average, name: str | None = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduces ``tensor`` over all ranks (those of ``process_set``) and
    returns this rank's block of rows (the first ``rows % n`` of the ``n``
    ranks get one extra row). ``compression`` casts for the wire and back;
    ``device_dense`` and ``ignore_name_scope`` are accepted for Horovod
    compatibility. Differentiable for Sum and Average, with Horovod's
    gradient (the allgather of the gradient, times ``n`` for Sum)."""
    ps = _checked_set(process_set, "reducescatter")
    op = resolve_op(None, op, "reducescatter")
    tensor = check_tensor(tensor, "reducescatter")
    _check_gatherable(tensor, "reducescatter")
    prescale, postscale = _scale_args(prescale_factor, postscale_factor)
    name = collective_name(name, "Reducescatter", tensor, ps.process_set_id)
    compressed, ctx = compression.compress(tensor)
    reduced = _differentiable_reducescatter([compressed], [name], op, prescale, postscale, ps)[0]
    return compression.decompress(reduced, ctx)


def grouped_reducescatter(tensors: Iterable[TensorLike], device_dense: str = "",
                          compression: type[Compressor] = Compression.none,
                          op: ReduceOp | int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          name: str | None = None) -> list[tf.Tensor]:
    """:func:`reducescatter` of each tensor of a list, submitted together
    (Horovod's arguments; ``name``, not in Horovod's, names the collectives)."""
    ps = _checked_set(process_set, "grouped_reducescatter")
    op = resolve_op(None, op, "grouped_reducescatter")
    checked = check_tensors(tensors, "grouped_reducescatter")
    if not checked:
        return []
    for i, t in enumerate(checked):
        _check_gatherable(t, f"grouped_reducescatter (tensor {i})")
    prescale, postscale = _scale_args(prescale_factor, postscale_factor)
    base = collective_name(name, "GroupedReducescatter", checked[0], ps.process_set_id)
    compressed = [compression.compress(t) for t in checked]
    reduced = _differentiable_reducescatter([c for c, _ in compressed],
                                            [f"{base}.{i}" for i in range(len(checked))],
                                            op, prescale, postscale, ps)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, compressed)]


# --- synchronization and topology as ops --------------------------------------

@unconverted
def _scalar_op(fn, name):
    return run(lambda: [np.asarray(fn(), np.int32)], [], [tf.int32], [[]], name)[0]


def join() -> tf.Tensor:
    """Marks this rank as out of data; until every rank has joined it takes
    part in the others' allreduces with neutral values. Returns (as an int32
    tensor) the rank that joined last. Always over every rank (Horovod's
    join takes no process set)."""
    return _scalar_op(_ops.join, "HoraJoin")


@unconverted
def barrier(process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Returns once every rank (of ``process_set``) has reached the barrier
    (an int32 zero tensor)."""
    ps = _checked_set(process_set, "barrier")

    def wait():
        _ops.barrier(process_set=ps)
        return 0
    return _scalar_op(wait, "HoraBarrier")


# Horovod's codes for a process set these ops cannot answer for
_PROCESS_SET_ERROR_INIT = -1
_PROCESS_SET_ERROR_UNKNOWN_SET = -3


def _set_ranks(ident):
    """The ranks of set ``ident`` (None when hora is not running or the set
    is unknown), read when the op runs."""
    if not is_initialized():
        return None
    return _C.process_sets().get(int(ident))


@unconverted
def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks (of the process set with id ``process_set_id``),
    as an int32 tensor read when the op runs; Horovod's error codes (-1: not
    initialized, -3: unknown set) otherwise."""
    def count():
        if int(process_set_id) == 0:
            return size() if is_initialized() else _PROCESS_SET_ERROR_INIT
        ranks = _set_ranks(process_set_id)
        if ranks is None:
            return _PROCESS_SET_ERROR_INIT if not is_initialized() else \
                _PROCESS_SET_ERROR_UNKNOWN_SET
        return len(ranks)
    return _scalar_op(count, name or "HoraSize")


@unconverted
def process_set_included_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """1 when this process is in the process set with id ``process_set_id``,
    0 when not, as an int32 tensor read when the op runs; Horovod's error
    codes (-1: not initialized, -3: unknown set) otherwise."""
    def included():
        if not is_initialized():
            return _PROCESS_SET_ERROR_INIT
        if int(process_set_id) == 0:
            return 1
        ranks = _set_ranks(process_set_id)
        if ranks is None:
            return _PROCESS_SET_ERROR_UNKNOWN_SET
        return int(rank() in ranks)
    return _scalar_op(included, name or "HoraProcessSetIncluded")


def rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank, as an int32 tensor."""
    return _scalar_op(rank, name or "HoraRank")


def local_size_op(name: str | None = None) -> tf.Tensor:
    """The number of ranks on this host, as an int32 tensor."""
    return _scalar_op(local_size, name or "HoraLocalSize")


def local_rank_op(name: str | None = None) -> tf.Tensor:
    """This process's rank on its host, as an int32 tensor."""
    return _scalar_op(local_rank, name or "HoraLocalRank")


def _now() -> _exact_gradients.Collectives:
    """This module's collectives, for the exact gradients."""
    return _exact_gradients.Collectives(_allreduce_now, _allgather_now, _reducescatter_now)


def handle_average_backwards_compatibility(op: Any, average: Any) -> Any:
    """Horovod's helper: the reduce op from ``op`` and the deprecated
    ``average`` (Average when neither is given)."""
    return resolve_op(average, op, "handle_average_backwards_compatibility")


def check_num_rank_power_of_2(num_rank: int) -> bool:
    """Whether ``num_rank`` is a power of two (Horovod's helper)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0
