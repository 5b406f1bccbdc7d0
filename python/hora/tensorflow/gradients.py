"""Averaging a list of gradients over all ranks, shared by
``DistributedGradientTape`` and the Keras ``DistributedOptimizer``.

All dense gradients of one call travel through one graph node (one
submission, so the engine fuses them); ``groups`` decides which of them are
negotiated as grouped units. ``tf.IndexedSlices`` gradients are gathered
from every rank unless ``sparse_as_dense`` turns them into dense tensors
first. ``None`` gradients stay ``None``.
"""

import numpy as np
import tensorflow as tf

from hora.common import ops as _ops
from hora.common.arguments import check_op, check_process_set
from hora.common.basics import Average, Sum, size
from hora.tensorflow._bridge import check_tensor, collective_name, run, wait_all
from hora.tensorflow.compression import Compression
from hora.tensorflow.mpi_ops import _allreduce_sparse


def _check_groups(groups, num_groups):
    if groups is not None and num_groups:
        raise ValueError("pass either groups or the deprecated num_groups, not both")
    if groups is None:
        groups = num_groups or None
    if groups is None or isinstance(groups, int) and not isinstance(groups, bool):
        if groups is not None and groups < 0:
            raise ValueError(f"groups must be a positive int or a list of variable lists, "
                             f"got {groups}")
        return groups or None
    groups = [list(group) for group in groups]
    seen = set()
    for group in groups:
        for variable in group:
            if id(variable) in seen:
                raise ValueError(f"groups: variable {getattr(variable, 'name', variable)!r} is "
                                 f"in more than one group")
            seen.add(id(variable))
    return groups


def _scaled(grad, factor):
    if grad is None or factor == 1.0:
        return grad
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * tf.cast(factor, grad.values.dtype), grad.indices,
                                grad.dense_shape)
    return grad * tf.cast(factor, grad.dtype)


class GradientReducer:
    """Callable: ``reducer(grads, variables=None)`` returns the gradients
    averaged (or summed, by ``op``) over all ranks, as a list."""

    def __init__(self, compression=Compression.none, sparse_as_dense=False, op=Average,
                 gradient_predivide_factor=1.0, groups=None, num_groups=0, process_set=None,
                 extra_postscale=1.0, what="gradients"):
        check_process_set(process_set, what)
        self.op = check_op(op)
        if self.op not in (Average, Sum):
            raise ValueError(f"{what}: op must be Average or Sum, got {self.op.name}")
        if gradient_predivide_factor != 1.0 and self.op != Average:
            raise ValueError(f"{what}: gradient_predivide_factor needs op=Average")
        if gradient_predivide_factor <= 0:
            raise ValueError(f"{what}: gradient_predivide_factor must be positive, got "
                             f"{gradient_predivide_factor}")
        self.compression = compression
        self.sparse_as_dense = bool(sparse_as_dense)
        # the core divides by size() after the postscale for Average
        self.prescale = 1.0 / gradient_predivide_factor
        self.postscale = gradient_predivide_factor * float(extra_postscale)
        self.groups = _check_groups(groups, num_groups)
        self.what = what

    def _units(self, positions, variables):
        """Lists of indices into ``positions``; lists of two or more are
        reduced as grouped units."""
        count = len(positions)
        if self.groups is None:
            return [[i] for i in range(count)]
        if isinstance(self.groups, int):
            return [list(chunk) for chunk in np.array_split(np.arange(count),
                                                            min(self.groups, count)) if len(chunk)]
        if variables is None:
            raise ValueError(f"{self.what}: groups given as lists of variables need the "
                             f"variables; pass an int number of groups instead")
        group_of = {id(v): g for g, group in enumerate(self.groups) for v in group}
        units, by_group = [], {}
        for i, position in enumerate(positions):
            g = group_of.get(id(variables[position]))
            if g is None:
                units.append([i])
            elif g in by_group:
                by_group[g].append(i)
            else:
                by_group[g] = [i]
                units.append(by_group[g])
        return units

    def __call__(self, grads, variables=None):
        grads = list(grads)
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        if size() == 1:  # nothing to exchange; only the scaling remains
            return [_scaled(g, self.prescale * self.postscale) for g in grads]
        results = list(grads)
        dense = [i for i, g in enumerate(grads)
                 if g is not None and not isinstance(g, tf.IndexedSlices)]
        if dense:
            tensors = [check_tensor(grads[i], f"{self.what} (gradient {i})") for i in dense]
            base = collective_name(None, "GradientAllreduce", tensors[0])
            compressed = [self.compression.compress(t) for t in tensors]
            reduced = self._reduce([c for c, _ in compressed], base, self._units(dense, variables))
            for i, value, (_, ctx) in zip(dense, reduced, compressed):
                results[i] = self.compression.decompress(value, ctx)
        for i, g in enumerate(grads):
            if isinstance(g, tf.IndexedSlices):
                name = collective_name(None, "GradientAllreduce", g.values)
                results[i] = _allreduce_sparse(g, self.op, self.prescale, self.postscale, name)
        return results

    def _reduce(self, tensors, base, units):
        op, prescale, postscale = self.op, self.prescale, self.postscale

        def reduce(*arrays):
            handles = []
            for u, unit in enumerate(units):
                if len(unit) == 1:
                    handles.append(_ops.allreduce_async(arrays[unit[0]], f"{base}.{unit[0]}", op,
                                                        prescale, postscale))
                else:
                    handles.append(_ops.grouped_allreduce_async(
                        [arrays[i] for i in unit], f"{base}.group{u}", op, prescale, postscale))
            out = [None] * len(arrays)
            for unit, result in zip(units, wait_all(handles)):
                for i, value in zip(unit, result if len(unit) > 1 else [result]):
                    out[i] = value
            return out
        return run(reduce, tensors, [t.dtype for t in tensors], [t.shape for t in tensors], base)
