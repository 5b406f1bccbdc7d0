"""Averaging a list of gradients over all ranks (or the ranks of a process
set), shared by ``DistributedGradientTape`` and the Keras
``DistributedOptimizer``.

All dense gradients of one call travel through one graph node (one
submission, so the engine fuses them); ``groups`` decides which of them are
negotiated as grouped units, split as in every hora framework (see
:mod:`hora.common.gradient_policy`). ``tf.IndexedSlices`` gradients are
gathered from every rank unless ``sparse_as_dense`` turns them into dense
tensors first. ``None`` gradients stay ``None``. Gradients of variables
registered as local (``register_local``: model-parallel parts that each rank
trains on its own, Horovod's ``local_layers``) are not reduced; as in
Horovod, they are divided by ``size()`` when ``scale_local_gradients``.

With a ``process_set`` the gradients are reduced among its ranks (an
Average divides by its size, and so does the local gradients' scaling). As
in Horovod, a process outside the set, or a set of one rank, reduces
nothing: its gradients come back as they are (scaled only where hora's
settings scale them, as in a one-rank job).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from hora.common import ops as _ops
from hora.common._adapter.handles import wait_all
from hora.common.basics import Average, ReduceOp
from hora.common.gradient_policy import gradient_policy
from hora.common._adapter.checks import process_set_id
from hora.common.process_sets import ProcessSet, global_process_set, set_rank, set_size
from hora.tensorflow._bridge import check_tensor, collective_name, run, unconverted
from hora.tensorflow._outputs import OutputPool
from hora.tensorflow.compression import Compression
from hora.tensorflow.mpi_ops import _allreduce_sparse


def _scaled(grad, factor):
    if grad is None or factor == 1.0:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


class GradientReducer:
    """Callable: ``reducer(grads, variables=None)`` returns the gradients
    averaged (or summed, by ``op``) over all ranks (of ``process_set``), as
    a list. ``stacklevel`` is that of the ``num_groups`` deprecation
    warning, as counted from the caller."""

    def __init__(self, compression: Any = Compression.none, sparse_as_dense: bool = False,
                 op: ReduceOp | int = Average, gradient_predivide_factor: float = 1.0,
                 groups: Any = None, num_groups: int = 0,
                 process_set: ProcessSet = global_process_set,
                 extra_postscale: float = 1.0, what: str = "gradients",
                 stacklevel: int = 1, scale_local_gradients: bool = True) -> None:
        process_set_id(process_set, what)  # TypeError / ValueError for a bad or unregistered set
        self.process_set = global_process_set if process_set is None else process_set
        policy = gradient_policy(what, op, gradient_predivide_factor, groups, num_groups,
                                 compression, stacklevel=stacklevel + 1)
        self.op = policy.op
        self.compression = policy.compression
        self.sparse_as_dense = bool(sparse_as_dense)
        self.prescale = policy.prescale
        self.postscale = policy.postscale * float(extra_postscale)
        # Keras 3's accumulation averages the passes and this makes them a
        # sum again (Horovod's); local gradients get it too
        self.extra_postscale = float(extra_postscale)
        self.policy = policy
        self.what = what
        self.scale_local_gradients = bool(scale_local_gradients)
        # the variables (tf or Keras 3) whose gradients stay local, by id;
        # holding them keeps their ids from being reused
        self.local: dict[int, Any] = {}
        self._outputs = OutputPool()

    def register_local(self, variable: Any) -> None:
        """Keeps ``variable``'s gradient out of the reduction."""
        self.local[id(variable)] = variable

    def is_local(self, variable: Any) -> bool:
        """Whether ``variable``'s gradient stays local."""
        return id(variable) in self.local

    def _split_local(self, grads, variables):
        """(positions of local gradients, grads with those set to None)."""
        if not self.local or variables is None:
            return [], grads
        mine = [i for i, v in enumerate(variables)
                if id(v) in self.local and grads[i] is not None]
        kept = list(grads)
        for i in mine:
            kept[i] = None
        return mine, kept

    def units(self, grads: Sequence[Any], variables: Sequence[Any] | None = None
              ) -> list[list[int]]:
        """Positions into ``grads`` of the gradients reduced together: the
        gradients that are not None, grouped by the policy (dense and
        ``tf.IndexedSlices`` alike, as Horovod splits them; the sparse
        members of a unit are then gathered on their own)."""
        present = [i for i, g in enumerate(grads) if g is not None]
        if self.policy.groups is None or isinstance(self.policy.groups, int):
            keys = present
        elif variables is None:
            raise ValueError(f"{self.what}: groups given as lists of variables need the "
                             f"variables; pass an int number of groups instead")
        else:
            keys = [id(variables[i]) for i in present]
        return [[present[k] for k in unit] for unit in self.policy.units(keys)]

    def __call__(self, grads: Sequence[Any], variables: Sequence[Any] | None = None
                 ) -> list[Any]:
        original = list(grads)
        local, grads = self._split_local(original, variables)
        results = self._reduce_all(grads, variables)
        factor = 1.0 / set_size(self.process_set) if self.scale_local_gradients else 1.0
        factor *= self.extra_postscale
        for i in local:
            results[i] = _scaled(original[i], factor)
        return results

    def _reduce_all(self, grads, variables):
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        ps = self.process_set
        if set_size(ps) == 1 or set_rank(ps) < 0:
            # nothing to exchange (one rank, or not in the set: Horovod hands
            # such gradients back unreduced); only the scaling remains
            return [_scaled(g, self.prescale * self.postscale) for g in grads]
        ident = ps.process_set_id
        results = list(grads)
        dense = [i for i, g in enumerate(grads)
                 if g is not None and not isinstance(g, tf.IndexedSlices)]
        if dense:
            tensors = [check_tensor(grads[i], f"{self.what} (gradient {i})") for i in dense]
            base = collective_name(None, "GradientAllreduce", tensors[0], ident)
            compressed = [self.compression.compress(t) for t in tensors]
            slot = {position: k for k, position in enumerate(dense)}
            units = [[slot[i] for i in unit if i in slot]
                     for unit in self.units(grads, variables)]
            reduced = self._reduce([c for c, _ in compressed], base, [u for u in units if u])
            for i, value, (_, ctx) in zip(dense, reduced, compressed):
                results[i] = self.compression.decompress(value, ctx)
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                name = collective_name(None, "GradientAllreduce", g.values, ident)
                results[i] = _allreduce_sparse(g, self.op, self.prescale, self.postscale, name,
                                               ps)
        return results

    @unconverted
    def _reduce(self, tensors, base, units):
        """Reduces ``tensors`` in one graph node; ``units`` are lists of
        indices into ``tensors``, lists of two or more reduced as grouped
        units."""
        op, prescale, postscale, ps = self.op, self.prescale, self.postscale, self.process_set
        pool = self._outputs

        def reduce(*arrays):
            handles = []
            for u, unit in enumerate(units):
                if len(unit) == 1:
                    x = arrays[unit[0]]
                    handles.append(_ops.allreduce_async(x, f"{base}.{unit[0]}", op, prescale,
                                                        postscale, process_set=ps,
                                                        out=pool.like(unit[0], x)))
                else:
                    members = [arrays[i] for i in unit]
                    handles.append(_ops.grouped_allreduce_async(
                        members, f"{base}.group{u}", op, prescale, postscale, process_set=ps,
                        out=[pool.like(i, arrays[i]) for i in unit]))
            out = [None] * len(arrays)
            for unit, result in zip(units, wait_all(handles)):
                for i, value in zip(unit, result if len(unit) > 1 else [result]):
                    out[i] = value
            return out
        return run(reduce, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], base)
