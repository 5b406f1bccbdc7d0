"""``hvd.DistributedOptimizer`` for TensorFlow 1's optimizers
(``tf.compat.v1.train.Optimizer``: ``GradientDescentOptimizer``,
``AdamOptimizer``, ...), in TF1-style graphs run by a ``Session`` and
eagerly, as Horovod's ``horovod.tensorflow`` wraps them.

``compute_gradients`` (and so ``minimize``) returns the gradients averaged
over all ranks (of ``process_set``) through the same reduction as
``DistributedGradientTape``; ``apply_gradients`` and the slot accessors are
the wrapped optimizer's. With ``backward_passes_per_step=N`` (graph mode
only, as in Horovod) each rank sums its gradients in local variables (in
``tf.compat.v1.GraphKeys.LOCAL_VARIABLES``, so ``local_variables_initializer``
or a ``MonitoredTrainingSession`` initializes them) and the ranks reduce and
apply the sum every N-th run; on the other runs ``apply_gradients`` applies
nothing and only advances ``global_step``.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora.common.basics import Average, ReduceOp
from hora.common.process_sets import ProcessSet, global_process_set
from hora.tensorflow.compression import Compression
from hora.tensorflow.gradients import GradientReducer

LegacyOptimizer = tf.compat.v1.train.Optimizer


class _Accumulators:
    """The pass counter and one sum per gradient of one graph."""

    def __init__(self, name: str, grads: list[Any]) -> None:
        local = [tf.compat.v1.GraphKeys.LOCAL_VARIABLES]
        with tf.compat.v1.name_scope(f"{name}_accumulation"):
            self.counter = tf.compat.v1.Variable(0, dtype=tf.int32, trainable=False,
                                                 collections=local, name="passes")
            self.sums = [tf.compat.v1.Variable(tf.zeros(g.shape, g.dtype), trainable=False,
                                               collections=local, name=f"sum_{i}")
                         for i, g in enumerate(grads)]


class _DistributedOptimizer(LegacyOptimizer):  # type: ignore[valid-type,misc]
    """Wraps a ``tf.compat.v1.train.Optimizer``; made by
    :func:`hora.tensorflow.DistributedOptimizer`."""

    def __init__(self, optimizer: Any, name: str | None = None, use_locking: bool = False,
                 device_dense: str = "", device_sparse: str = "",
                 compression: Any = Compression.none, sparse_as_dense: bool = False,
                 op: ReduceOp | int = Average, gradient_predivide_factor: float = 1.0,
                 backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
                 groups: Any = None, process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True) -> None:
        if name is None:
            name = f"Distributed{type(optimizer).__name__}"
        super().__init__(name=name, use_locking=use_locking)
        self._optimizer = optimizer
        self._reducer = GradientReducer(
            compression=compression, sparse_as_dense=sparse_as_dense, op=op,
            gradient_predivide_factor=gradient_predivide_factor, groups=groups,
            process_set=process_set, what=f"DistributedOptimizer({name})",
            scale_local_gradients=scale_local_gradients)
        self.process_set = process_set
        self.scale_local_gradients = scale_local_gradients
        self._passes = backward_passes_per_step
        self._average_passes = average_aggregated_gradients
        self._sparse_as_dense = sparse_as_dense
        # per graph: a wrapper used in two graphs accumulates in each
        self._accumulators: dict[int, _Accumulators] = {}
        if self._passes > 1 and tf.executing_eagerly():
            raise ValueError("backward_passes_per_step > 1 is not yet supported for "
                             "_LegacyOptimizer with eager execution. (hora: build the training "
                             "step in a tf.Graph run by a tf.compat.v1.Session, or use a Keras "
                             "optimizer, which accumulates eagerly)")

    def register_local_var(self, var: Any) -> None:
        """Keeps ``var``'s gradient out of the reduction (a variable this
        rank trains on its own); it is divided by the number of ranks when
        ``scale_local_gradients``, as in Horovod."""
        self._reducer.register_local(var)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        """The wrapped optimizer's gradients, averaged over the ranks (every
        ``backward_passes_per_step``-th run, their local sum)."""
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if self._passes > 1:
            reduced = self._accumulated(grads, variables)
        else:
            reduced = self._reducer(grads, variables)
        return list(zip(reduced, variables))

    def apply_gradients(self, grads_and_vars: Any, global_step: Any = None,
                        name: str | None = None) -> Any:
        """The wrapped optimizer's ``apply_gradients``; with
        ``backward_passes_per_step`` > 1 only on the runs that reduced, the
        others advancing ``global_step`` alone."""
        if self._passes == 1:
            return self._optimizer.apply_gradients(grads_and_vars, global_step=global_step,
                                                   name=name)
        grads_and_vars = list(grads_and_vars)
        state = self._accumulators.get(id(tf.compat.v1.get_default_graph()))
        if state is None:
            raise ValueError(f"{self.get_name()}: with backward_passes_per_step > 1, call "
                             f"compute_gradients (or minimize) of this optimizer in this graph "
                             f"before apply_gradients")
        inputs = [t for pair in grads_and_vars for t in pair if t is not None]
        with tf.control_dependencies([tf.group(*inputs)]):
            applied = tf.cond(
                tf.equal(state.counter, 0),
                lambda: tf.group(self._optimizer.apply_gradients(
                    grads_and_vars, global_step=global_step, name=name)),
                tf.no_op)
        with tf.control_dependencies([applied]):
            if global_step is None:
                return tf.group(applied)

            def advance():
                return tf.group(global_step.assign_add(tf.constant(1, global_step.dtype.base_dtype),
                                                       use_locking=True, read_value=False))
            return tf.cond(tf.equal(state.counter, 0), tf.no_op, advance)

    def _dense(self, grad: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            if not self._sparse_as_dense:
                raise ValueError("IndexedSlices are not supported when `backward_passes_per_step` "
                                 "> 1 and `sparse_as_dense` is False.")
            return tf.convert_to_tensor(grad)
        return grad

    def _accumulated(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        present = [i for i, g in enumerate(grads) if g is not None]
        dense = [self._dense(grads[i]) for i in present]
        graph = tf.compat.v1.get_default_graph()
        state = self._accumulators.get(id(graph))
        if state is None or len(state.sums) != len(dense):
            state = self._accumulators[id(graph)] = _Accumulators(self.get_name(), dense)
        counter, sums = state.counter, state.sums

        def clear():
            return tf.group(*[s.assign(tf.zeros_like(s)) for s in sums])
        cleared = tf.cond(tf.equal(counter, 0), clear, tf.no_op)
        with tf.control_dependencies([cleared]):
            added = tf.group(*[s.assign_add(g) for s, g in zip(sums, dense)])
        with tf.control_dependencies([added]):
            counted = counter.assign_add(1)
        with tf.control_dependencies([counted]):
            passes = counter.read_value()

        def communicate():
            totals = [s.read_value() for s in sums]
            reduced = self._reducer(totals, [variables[i] for i in present])
            with tf.control_dependencies(reduced):
                reset = counter.assign(0, use_locking=True)
            with tf.control_dependencies([reset]):
                if self._average_passes:
                    return [r / tf.cast(self._passes, r.dtype) for r in reduced]
                return [tf.identity(r) for r in reduced]

        def this_pass():
            return [tf.identity(g) for g in dense]
        outputs = tf.cond(tf.equal(passes, self._passes), communicate, this_pass)
        if not isinstance(outputs, (list, tuple)):
            outputs = [outputs]
        result: list[Any] = [None] * len(grads)
        for i, value in zip(present, outputs):
            result[i] = value
        return result

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's ``get_slot``."""
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's ``get_slot_names``."""
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        """The wrapped optimizer's ``variables``."""
        return self._optimizer.variables(*args, **kwargs)
