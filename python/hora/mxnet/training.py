"""Training helpers for MXNet: DistributedOptimizer, DistributedTrainer and
broadcast_parameters, with Horovod's names and arguments."""

import types
import warnings

import mxnet as mx

from hora.common import ops as _ops
from hora.common.arguments import check_process_set, check_root
from hora.common.basics import Sum, size
from hora.mxnet.compression import Compression
from hora.mxnet.mpi_ops import _check, _Memory, broadcast_


def _check_factor(factor, what):
    factor = float(factor)
    if factor <= 0:
        raise ValueError(f"{what}: gradient_predivide_factor must be positive, got {factor}")
    return factor


def _sum_in_place(arrays, names, prescale, num_groups):
    """Sums ``arrays`` over all ranks in place, in one submission (fused by
    the engine), or as ``num_groups`` grouped units."""
    memories = [_Memory(a, True) for a in arrays]
    if num_groups and num_groups > 0:
        count = min(num_groups, len(memories))
        chunks = [list(range(len(memories)))[g::count] for g in range(count)]
        handles = [_ops.grouped_allreduce_async_([memories[i] for i in chunk],
                                                 f"{names[chunk[0]]}.group", Sum, prescale)
                   for chunk in chunks]
    else:
        handles = [_ops.allreduce_async_(m, n, Sum, prescale) for m, n in zip(memories, names)]
    first_error = None
    for handle in handles:  # wait for all before raising, so nothing is left in flight
        try:
            _ops.synchronize(handle)
        except Exception as error:  # noqa: BLE001 - re-raised below
            first_error = first_error or error
    if first_error is not None:
        raise first_error


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an ``mx.optimizer.Optimizer`` so that ``update`` and
    ``update_multi_precision`` first sum the gradient over all ranks; the
    division by ``size()`` is folded into the wrapped optimizer's
    ``rescale_grad``, as Horovod does. ``gradient_predivide_factor`` divides
    before the sum (and multiplies back after); ``num_groups > 0`` reduces
    the gradients of one multi-index update as that many fused units. Every
    other attribute is the wrapped optimizer's."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0, process_set=None):
        check_process_set(process_set, "DistributedOptimizer")
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps an mx.optimizer.Optimizer, got "
                            f"{type(optimizer).__name__}")
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_predivide",
                           _check_factor(gradient_predivide_factor, "DistributedOptimizer"))
        object.__setattr__(self, "_num_groups", int(num_groups))
        self._optimizer.rescale_grad *= self._predivide / size()

    def __getattr__(self, item):
        return getattr(self._optimizer, item)

    def __setattr__(self, name, value):
        # gluon.Trainer and Module set rescale_grad, param_dict, ... on the
        # optimizer they were given; they belong to the wrapped one.
        setattr(self._optimizer, name, value)

    def create_state(self, index, weight):
        return self._optimizer.create_state(index, weight)

    def create_state_multi_precision(self, index, weight):
        return self._optimizer.create_state_multi_precision(index, weight)

    def _reduce(self, index, grad):
        if size() == 1:
            return
        indices = list(index) if isinstance(index, (list, tuple)) else [index]
        grads = list(grad) if isinstance(grad, (list, tuple)) else [grad]
        for g in grads:
            _check(g, "DistributedOptimizer gradient")
        _sum_in_place(grads, [f"optimizer.grad.{i}" for i in indices], 1.0 / self._predivide,
                      self._num_groups)

    def update(self, index, weight, grad, state):
        """Sums ``grad`` over all ranks, then runs the wrapped update."""
        self._reduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        """Sums ``grad`` over all ranks, then runs the wrapped update."""
        self._reduce(index, grad)
        self._optimizer.update_multi_precision(index, weight, grad, state)

    def set_learning_rate(self, lr):
        self._optimizer.set_learning_rate(lr)

    def set_lr_mult(self, args_lr_mult):
        self._optimizer.set_lr_mult(args_lr_mult)

    def set_wd_mult(self, args_wd_mult):
        self._optimizer.set_wd_mult(args_wd_mult)


class DistributedTrainer(mx.gluon.Trainer):
    """A ``gluon.Trainer`` whose gradients are averaged over all ranks by
    hora (no kvstore). ``step(batch_size)`` takes the per-rank batch size,
    as with a plain Trainer. ``compression`` casts gradients for the wire
    (``Compression.fp16``); ``gradient_predivide_factor`` divides before the
    sum; ``prefix`` is prepended to the names the gradients are matched by
    (needed when several trainers run in one job); ``num_groups > 0``
    reduces the gradients as that many fused units."""

    def __init__(self, params, optimizer, optimizer_params=None, compression=Compression.none,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0, process_set=None):
        check_process_set(process_set, "DistributedTrainer")
        if isinstance(optimizer, DistributedOptimizer):
            warnings.warn("DistributedTrainer reduces the gradients itself; the "
                          "DistributedOptimizer wrapper is removed", stacklevel=2)
            wrapper, optimizer = optimizer, optimizer._optimizer
            # undo the wrapper's division, which the trainer's scale would repeat
            optimizer.rescale_grad *= size() / wrapper._predivide
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._hora_compression = compression
        self._hora_predivide = _check_factor(gradient_predivide_factor, "DistributedTrainer")
        self._hora_prefix = "" if prefix is None else str(prefix)
        self._hora_num_groups = int(num_groups)
        # Trainer.step divides by batch_size through _scale; dividing by
        # size() too turns the sum over ranks into the average
        self._scale *= self._hora_predivide / size()

    def _allreduce_grads(self):
        if size() == 1:
            return
        grads, names, restore = [], [], []
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = _check(param.list_grad()[0], f"DistributedTrainer gradient of {param.name}")
            wire, ctx = self._hora_compression.compress(grad)
            grads.append(wire)
            # by position, not param.name: MXNet's automatic block names
            # depend on how many blocks each process has made before
            names.append(f"{self._hora_prefix}trainer.grad.{i}")
            if wire is not grad:
                restore.append((grad, wire, ctx))
        _sum_in_place(grads, names, 1.0 / self._hora_predivide, self._hora_num_groups)
        for grad, wire, ctx in restore:
            grad[:] = self._hora_compression.decompress(wire, ctx)


def _broadcast_after_init(param, root_rank, name):
    """Makes a deferred-initialization parameter broadcast its value from
    ``root_rank`` right after MXNet initializes it."""
    original = param._init_impl

    def init_then_broadcast(self, *args, **kwargs):
        original(*args, **kwargs)
        broadcast_(self.data(), root_rank, name=name)
        self._init_impl = original  # only once
    param._init_impl = types.MethodType(init_then_broadcast, param)


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Sets every rank's parameters to ``root_rank``'s.

    ``params`` is a gluon ``ParameterDict`` (``net.collect_params()``) or a
    dict of name to NDArray (Module's ``arg_params``/``aux_params``).
    Parameters whose initialization is deferred (shapes not known until the
    first forward pass) are broadcast right after they are initialized, so
    every rank must run that first pass. ``prefix`` is prepended to the
    names the values are matched by."""
    root_rank = check_root(root_rank, "broadcast_parameters")
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"broadcast_parameters: prefix must be a str, got "
                        f"{type(prefix).__name__}")
    prefix = prefix or ""
    if isinstance(params, mx.gluon.ParameterDict):
        arrays = []
        for name, param in sorted(params.items()):
            try:
                arrays.append((name, param.data()))
            except mx.gluon.parameter.DeferredInitializationError:
                _broadcast_after_init(param, root_rank, f"{prefix}parameter.{name}")
    elif isinstance(params, dict):
        arrays = sorted(params.items(), key=lambda item: str(item[0]))
    else:
        raise TypeError(f"broadcast_parameters takes a gluon ParameterDict or a dict of "
                        f"NDArrays, got {type(params).__name__}")
    for name, array in arrays:
        _check(array, f"broadcast_parameters '{name}'")
    handles = [_ops.broadcast_async_(_Memory(array, True), root_rank, f"{prefix}parameter.{name}")
               for name, array in arrays]
    for handle in handles:
        _ops.synchronize(handle)
