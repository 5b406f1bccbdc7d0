"""Training helpers for MXNet: DistributedOptimizer, DistributedTrainer and
broadcast_parameters, with Horovod's names and arguments.

``process_set=`` reduces the gradients among that set's ranks only (the
average is over the set's size); on ranks outside the set the gradients
are not reduced and the update is a local one, as in Horovod.
"""

from __future__ import annotations

import types
import warnings
from typing import Any

import mxnet as mx

from hora.common import ops as _ops
from hora.common._adapter.handles import wait_all
from hora.common._adapter.checks import check_root
from hora.common.basics import Sum
from hora.common.exceptions import HoraTypeError
from hora.common.compression import Compressor
from hora.common.gradient_policy import GradientPolicy, gradient_policy
from hora.common.process_sets import ProcessSet, global_process_set, set_size
from hora.mxnet._arrays import Memory, check_array, set_object
from hora.mxnet.compression import Compression
from hora.mxnet.mpi_ops import broadcast_


def _policy(what: str, gradient_predivide_factor: float, num_groups: int,
            compression: Any = Compression.none) -> GradientPolicy:
    # MXNet's num_groups is Horovod's only spelling there, not a deprecated one
    return gradient_policy(what, gradient_predivide_factor=gradient_predivide_factor,
                           num_groups=num_groups, compression=compression,
                           num_groups_deprecated=False)


def _sum_in_place(arrays, names, prescale, policy: GradientPolicy, process_set: ProcessSet):
    """Sums ``arrays`` over the ranks of ``process_set`` in place, in one
    submission (fused by the engine), in the policy's groups (split as in
    every hora framework, see :mod:`hora.common.gradient_policy`)."""
    memories = [Memory(a, True) for a in arrays]
    handles = []
    for unit in policy.units(names):
        if policy.groups is None:
            handles.append(_ops.allreduce_async_(memories[unit[0]], names[unit[0]], Sum,
                                                 prescale, process_set=process_set))
        else:
            handles.append(_ops.grouped_allreduce_async_([memories[i] for i in unit],
                                                         f"{names[unit[0]]}.group", Sum, prescale,
                                                         process_set=process_set))
    wait_all(handles)


def _reduces(process_set: ProcessSet, policy: GradientPolicy) -> tuple[bool, float, float]:
    """Whether this rank takes part in ``process_set``'s gradient
    reductions (Horovod reduces nothing in a set of one rank or on a rank
    outside the set), and the factor folded into the gradients' scale, as
    the numerator and denominator it is made of: the postscale over the
    set's size when reducing. Without a reduction the prescale is not
    applied, so neither is the postscale that undoes it (Horovod multiplies
    such gradients by ``gradient_predivide_factor``)."""
    members = set_size(process_set)
    inside = process_set is global_process_set or bool(process_set.included())
    reduces = inside and members > 1
    return reduces, policy.postscale if reduces else 1.0, float(members)


class DistributedOptimizer(mx.optimizer.Optimizer):
    """Wraps an ``mx.optimizer.Optimizer`` so that ``update`` and
    ``update_multi_precision`` first sum the gradient over all ranks; the
    division by ``size()`` (the set's) is folded into the wrapped optimizer's
    ``rescale_grad``, as Horovod does. ``gradient_predivide_factor`` divides
    before the sum (and multiplies back after); ``num_groups > 0`` reduces
    the gradients of one multi-index update as that many fused units (split
    in order into contiguous blocks, as Horovod does). ``process_set``
    sums over that set's ranks and divides by its size (on every rank, as
    Horovod does); ranks outside the set update with their own gradients.
    Every other attribute is the wrapped optimizer's."""

    def __init__(self, optimizer: mx.optimizer.Optimizer, gradient_predivide_factor: float = 1.0,
                 num_groups: int = 0, process_set: ProcessSet = global_process_set) -> None:
        process_set = set_object(process_set, "DistributedOptimizer")
        if not isinstance(optimizer, mx.optimizer.Optimizer):
            raise TypeError(f"DistributedOptimizer wraps an mx.optimizer.Optimizer, got "
                            f"{type(optimizer).__name__}")
        policy = _policy("DistributedOptimizer", gradient_predivide_factor, num_groups)
        reduces, post, members = _reduces(process_set, policy)
        object.__setattr__(self, "_optimizer", optimizer)
        object.__setattr__(self, "_hora_policy", policy)
        object.__setattr__(self, "_hora_process_set", process_set)
        object.__setattr__(self, "_hora_reduces", reduces)
        object.__setattr__(self, "_hora_folded", (post, members))
        # the core sums; the rest of the average is folded into rescale_grad
        self._optimizer.rescale_grad *= post / members

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

    def _do_allreduce(self, index, grad):
        """Sums ``grad`` (one array or a list, for ``index`` one index or a
        list) over the ranks in place (Horovod's method, which scripts
        override or call)."""
        if not self._hora_reduces:
            return
        indices = list(index) if isinstance(index, (list, tuple)) else [index]
        grads = list(grad) if isinstance(grad, (list, tuple)) else [grad]
        for g in grads:
            check_array(g, "DistributedOptimizer gradient")
        _sum_in_place(grads, [f"optimizer.grad.{i}" for i in indices], self._hora_policy.prescale,
                      self._hora_policy, self._hora_process_set)

    def update(self, index, weight, grad, state):
        """Sums ``grad`` over all ranks (of the process set), then runs the
        wrapped update."""
        self._do_allreduce(index, grad)
        self._optimizer.update(index, weight, grad, state)

    def update_multi_precision(self, index, weight, grad, state):
        """Sums ``grad`` over all ranks (of the process set), then runs the
        wrapped update."""
        self._do_allreduce(index, grad)
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
    reduces the gradients as that many fused units (split in order into
    contiguous blocks, as Horovod does); ``process_set`` averages over that
    set's ranks (ranks outside it step with their own gradients, still
    divided by the set's size, as Horovod does)."""

    def __init__(self, params: Any, optimizer: str | mx.optimizer.Optimizer,
                 optimizer_params: dict[str, Any] | None = None,
                 compression: type[Compressor] = Compression.none,
                 gradient_predivide_factor: float = 1.0, prefix: str | None = None,
                 num_groups: int = 0, process_set: ProcessSet = global_process_set) -> None:
        process_set = set_object(process_set, "DistributedTrainer")
        policy = _policy("DistributedTrainer", gradient_predivide_factor, num_groups, compression)
        if isinstance(optimizer, DistributedOptimizer):
            warnings.warn("DistributedTrainer reduces the gradients itself; the "
                          "DistributedOptimizer wrapper is removed", stacklevel=2)
            wrapper, optimizer = optimizer, optimizer._optimizer
            # undo the wrapper's division, which the trainer's scale would repeat
            post, members = wrapper._hora_folded
            optimizer.rescale_grad *= members / post
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._hora_policy = policy
        # Horovod's attribute names (scripts read them)
        self._prefix = "" if prefix is None else str(prefix)
        self._compression = policy.compression
        self._gradient_predivide_factor = gradient_predivide_factor
        self._num_groups = num_groups
        self._process_set = process_set
        self._hora_process_set = process_set
        self._hora_reduces, post, members = _reduces(process_set, policy)
        # Trainer.step divides by batch_size through _scale; dividing by
        # the set's size too turns the sum over its ranks into the average
        self._scale *= post / members

    def _allreduce_grads(self):
        if not self._hora_reduces:
            return
        grads, names, restore = [], [], []
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = check_array(param.list_grad()[0],
                               f"DistributedTrainer gradient of {param.name}")
            wire, ctx = self._compression.compress(grad)
            grads.append(wire)
            # by position, not param.name: MXNet's automatic block names
            # depend on how many blocks each process has made before
            names.append(f"{self._prefix}trainer.grad.{i}")
            if wire is not grad:
                restore.append((grad, wire, ctx))
        _sum_in_place(grads, names, self._hora_policy.prescale, self._hora_policy,
                      self._hora_process_set)
        for grad, wire, ctx in restore:
            grad[:] = self._compression.decompress(wire, ctx)


def _broadcast_after_init(param, root_rank, name, process_set):
    """Makes a deferred-initialization parameter broadcast its value from
    ``root_rank`` right after MXNet initializes it, and after every later
    initialization too (``initialize(force_reinit=True)``), as Horovod's."""
    original = param._init_impl

    def init_then_broadcast(self, *args, **kwargs):
        original(*args, **kwargs)
        broadcast_(self.data(), root_rank, name=name, process_set=process_set)
    param._init_impl = types.MethodType(init_then_broadcast, param)


def broadcast_parameters(params: mx.gluon.ParameterDict | dict[str, mx.nd.NDArray],
                         root_rank: int = 0, prefix: str | None = None,
                         process_set: ProcessSet = global_process_set) -> None:
    """Sets every rank's parameters to ``root_rank``'s.

    ``params`` is a gluon ``ParameterDict`` (``net.collect_params()``) or a
    dict of name to NDArray (Module's ``arg_params``/``aux_params``) or to
    gluon ``Parameter`` (``dict(net.collect_params())``). With one rank
    (of the set) there is nothing to do, as in Horovod.
    Parameters whose initialization is deferred (shapes not known until the
    first forward pass) are broadcast right after they are initialized, so
    every rank must run that first pass. ``prefix`` is prepended to the
    names the values are matched by. ``process_set`` (hora's addition; not
    in Horovod's MXNet API) broadcasts among that set's ranks only, from
    ``root_rank``, a global rank in the set."""
    process_set = set_object(process_set, "broadcast_parameters")
    root_rank = check_root(root_rank, "broadcast_parameters")
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"broadcast_parameters: prefix must be a str, got "
                        f"{type(prefix).__name__}")
    prefix = prefix or ""
    if not isinstance(params, (mx.gluon.ParameterDict, dict)):
        raise HoraTypeError(f"broadcast_parameters takes a gluon ParameterDict or a dict of "
                            f"NDArrays or Parameters, got {type(params).__name__}")
    if set_size(process_set) == 1 and (process_set is global_process_set
                                       or process_set.included()):
        return
    arrays = []
    for name, value in sorted(params.items(), key=lambda item: str(item[0])):
        if not isinstance(value, mx.gluon.parameter.Parameter):
            arrays.append((name, value))
            continue
        try:
            arrays.append((name, value.data()))
        except mx.gluon.parameter.DeferredInitializationError:
            _broadcast_after_init(value, root_rank, f"{prefix}parameter.{name}", process_set)
    for name, array in arrays:
        check_array(array, f"broadcast_parameters '{name}'")
    wait_all([_ops.broadcast_async_(Memory(array, True), root_rank, f"{prefix}parameter.{name}",
                                    process_set=process_set)
              for name, array in arrays])
