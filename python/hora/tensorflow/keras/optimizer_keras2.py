"""DistributedOptimizer for Keras 2 optimizers: ``tf_keras``, which is
``tf.keras`` when ``TF_USE_LEGACY_KERAS=1`` (how Horovod's Keras scripts
run on TensorFlow 2.16+). Both kinds of Keras 2 optimizer are handled, those
of ``tf_keras.optimizers`` and the legacy ones of
``tf_keras.optimizers.legacy``.

As in Horovod, the gradients are averaged where the optimizer computes
them: ``compute_gradients`` (and the legacy ``_compute_gradients`` and
``get_gradients``), which ``minimize`` and ``model.fit`` call. A
``LossScaleOptimizer`` around the wrapped optimizer (``compile`` adds one
under the ``mixed_float16`` policy) therefore checks the reduced gradients
for overflow, and every rank decides alike. ``apply_gradients`` applies the
gradients it is given as they are (reduce gradients computed elsewhere with
``DistributedGradientTape``).

With ``backward_passes_per_step=N`` each pass's gradients are added to
local sums and the sums are reduced on every N-th pass (divided by N when
``average_aggregated_gradients``); ``apply_gradients`` updates the
variables on that pass and only counts the iteration on the others, as
Horovod's local gradient aggregation does.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora.tensorflow.gradients import GradientReducer


class LocalAccumulator:
    """Sums gradients over ``steps`` passes in variables of its own and
    hands back the reduced sums on the last pass of each round."""

    def __init__(self, steps: int, average: bool, reducer: GradientReducer) -> None:
        self.steps = steps
        self.average = average
        self.reducer = reducer
        self.counter = None
        self.sums: dict[int, Any] = {}

    def _counter(self) -> tf.Variable:
        if self.counter is None:
            with tf.init_scope():
                self.counter = tf.Variable(0, dtype=tf.int64, trainable=False,
                                           name="hora_accumulated_passes")
        return self.counter

    def _densify(self, grad: Any) -> Any:
        if isinstance(grad, tf.IndexedSlices):
            if not self.reducer.sparse_as_dense:
                raise ValueError("IndexedSlices are not supported when backward_passes_per_step "
                                 "> 1 and sparse_as_dense is False")
            return tf.convert_to_tensor(grad)
        return grad

    def gradients(self, grads: list[Any], variables: list[Any]) -> list[Any]:
        """The running sums after adding ``grads``; reduced over the ranks
        (and the sums cleared) when this pass completes a round."""
        grads = [None if g is None else self._densify(g) for g in grads]
        counter = self._counter()
        present = [i for i, g in enumerate(grads) if g is not None]
        with tf.init_scope():
            for i in present:
                if i not in self.sums:
                    self.sums[i] = tf.Variable(tf.zeros(variables[i].shape, grads[i].dtype),
                                               trainable=False)
        sums = []
        for i in present:
            self.sums[i].assign_add(grads[i])
            sums.append(self.sums[i].read_value())
        passes = counter.assign_add(1)

        def reduce_and_clear():
            full = [None] * len(grads)
            for i, value in zip(present, sums):
                full[i] = value
            reduced = self.reducer(full, variables)
            reduced = [reduced[i] for i in present]
            if self.average:
                reduced = [r / tf.cast(self.steps, r.dtype) for r in reduced]
            with tf.control_dependencies(reduced):
                clears = [counter.assign(0)]
                clears += [self.sums[i].assign(tf.zeros_like(self.sums[i])) for i in present]
            with tf.control_dependencies(clears):
                return [tf.identity(r) for r in reduced]

        if not present:
            return grads
        chosen = tf.cond(tf.equal(passes, self.steps), reduce_and_clear, lambda: list(sums))
        result = list(grads)
        for i, value in zip(present, chosen):
            result[i] = value
        return result

    def apply(self, apply_fn: Any, optimizer: Any) -> Any:
        """Runs ``apply_fn`` at the end of a round; counts the optimizer's
        iteration otherwise."""
        def update():
            apply_fn()
            return tf.constant(True)

        def count_only():
            optimizer.iterations.assign_add(1)
            return tf.constant(False)

        tf.cond(tf.equal(self._counter(), 0), update, count_only)
        return optimizer.iterations


class _Keras2Distributed:
    """What both Keras 2 optimizer kinds share; the class attributes are
    the settings (so ``from_config`` builds a working instance)."""

    _hora_settings: dict[str, Any] = {}
    _hora_steps = 1
    _hora_average_aggregated = False
    _hora_name = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hora_setup()

    def _hora_setup(self):
        base = type(self).__name__  # the wrapped class's name
        # Horovod's name for the wrapped optimizer
        self._name = self._hora_name or f"Distributed{base}"
        self._hora_reducer = GradientReducer(what=f"DistributedOptimizer({base})",
                                             **self._hora_settings)
        self._hora_accumulator = (
            LocalAccumulator(self._hora_steps, self._hora_average_aggregated, self._hora_reducer)
            if self._hora_steps > 1 else None)

    def _hora_reduce(self, grads, variables):
        grads, variables = list(grads), list(variables)
        if self._hora_accumulator is not None:
            return self._hora_accumulator.gradients(grads, variables)
        return self._hora_reducer(grads, variables)

    def _hora_reduce_pairs(self, grads_and_vars):
        grads_and_vars = list(grads_and_vars)
        if not grads_and_vars:
            return grads_and_vars
        grads, variables = zip(*grads_and_vars)
        return list(zip(self._hora_reduce(grads, variables), variables))

    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        parent = super()
        if self._hora_accumulator is None:
            return parent.apply_gradients(grads_and_vars, *args, **kwargs)
        grads_and_vars = list(grads_and_vars)
        return self._hora_accumulator.apply(
            lambda: parent.apply_gradients(grads_and_vars, *args, **kwargs), self)

    def register_local_var(self, var):
        """Keeps ``var``'s gradient out of the reduction (a variable this
        rank trains on its own); it is divided by ``size()`` when
        ``scale_local_gradients``, as in Horovod."""
        self._hora_reducer.register_local(var)


class _Keras2DistributedOptimizer(_Keras2Distributed):
    """For ``tf_keras.optimizers.Optimizer`` subclasses."""

    def compute_gradients(self, loss, var_list, tape=None):
        return self._hora_reduce_pairs(super().compute_gradients(loss, var_list, tape=tape))


class _Keras2DistributedLegacyOptimizer(_Keras2Distributed):
    """For ``tf_keras.optimizers.legacy.Optimizer`` (OptimizerV2) subclasses."""

    def compute_gradients(self, loss, var_list, tape=None):
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        return self._hora_reduce_pairs(
            super()._compute_gradients(loss, var_list, grad_loss=grad_loss, tape=tape))

    def get_gradients(self, loss, params):
        return self._hora_reduce(super().get_gradients(loss, params), params)


def distributed_class_keras2(cls: type, settings: dict[str, Any], steps: int = 1,
                             average_aggregated: bool = False,
                             name: str | None = None) -> type[Any]:
    """A subclass of the Keras 2 optimizer class ``cls`` that reduces its
    gradients with ``settings`` (keyword arguments of GradientReducer)."""
    import tf_keras

    if issubclass(cls, _Keras2Distributed):
        raise ValueError(f"{cls.__name__} is already a hora DistributedOptimizer")
    mixin: type
    if issubclass(cls, tf_keras.optimizers.legacy.Optimizer):
        mixin = _Keras2DistributedLegacyOptimizer
    elif issubclass(cls, tf_keras.optimizers.Optimizer):
        mixin = _Keras2DistributedOptimizer
    else:
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer, got {cls.__name__}")
    return type(cls.__name__, (mixin, cls), {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "_hora_settings": dict(settings), "_hora_steps": int(steps),
        "_hora_average_aggregated": bool(average_aggregated), "_hora_name": name})


def distributed_optimizer_keras2(optimizer: Any, name: str | None, settings: dict[str, Any],
                                 steps: int, average_aggregated: bool) -> Any:
    """``optimizer`` (a Keras 2 optimizer) rebuilt from its config as a
    hora DistributedOptimizer."""
    cls = distributed_class_keras2(type(optimizer), settings, steps, average_aggregated, name)
    return cls.from_config(optimizer.get_config())


def adopt_keras2(optimizer: Any, settings: dict[str, Any]) -> None:
    """Turns the Keras 2 ``optimizer`` into a hora DistributedOptimizer in
    place, keeping its state (the inner optimizer of a loss-scale
    optimizer, which computes the gradients). Nothing to do if it is one."""
    target = getattr(optimizer, "inner_optimizer", optimizer)
    if isinstance(target, _Keras2Distributed):
        return
    target.__class__ = distributed_class_keras2(type(target), settings)
    target._hora_setup()
