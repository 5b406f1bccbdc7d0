"""DistributedOptimizer for Keras 3 optimizers (the Keras TensorFlow 2.16+
ships); Keras 2 optimizers (``tf_keras``) are handed to
:mod:`hora.tensorflow.keras.optimizer_keras2`.

``DistributedOptimizer(opt)`` returns a new optimizer of a subclass of
``type(opt)`` made on the fly, configured like ``opt`` (through
``get_config``/``from_config``, as Horovod does). Its gradients are
averaged over all ranks right before clipping and the update, so
``clipnorm``/``global_clipnorm`` see the global gradient, and with
``backward_passes_per_step=N`` (Keras's own ``gradient_accumulation_steps``)
the allreduce runs only on the steps that update. A ``LossScaleOptimizer``
is reduced before its finiteness check, so every rank takes the same
decision; under the ``mixed_float16`` policy a plain optimizer is wrapped in
one here, before ``compile`` would wrap it the other way round. The
subclass keeps the wrapped class's name and module, so a model saved with
it loads in plain Keras as the original optimizer, and
:func:`hora.tensorflow.keras.load_model` wraps it again.
"""

from __future__ import annotations

from typing import Any

from hora.common.basics import Average, ReduceOp
from hora.common.compression import Compressor
from hora.common.gradient_policy import check_backward_passes, resolve_groups
from hora.common.process_sets import ProcessSet, global_process_set
from hora.tensorflow.compression import Compression
from hora.tensorflow.gradients import GradientReducer
from hora.tensorflow.keras._flavor import is_tf_keras
from hora.tensorflow.keras.optimizer_keras2 import (
    adopt_keras2, distributed_class_keras2, distributed_optimizer_keras2)


class _DistributedOptimizer:
    """Mixed in before a Keras optimizer class; its settings are the class
    attribute ``_hora_settings``, so ``from_config`` builds a working
    instance (which is what ``load_model`` relies on)."""

    _hora_settings: dict[str, Any] = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hora_setup()

    def _hora_setup(self):
        self._hora_reducer = GradientReducer(what=f"DistributedOptimizer({self.name})",
                                             **self._hora_settings)

    def _backend_apply_gradients(self, grads, trainable_variables):
        # The variables of the gradients _clip_gradients gets, in order. Set
        # past Keras's attribute tracking, which would otherwise count them
        # among the optimizer's own variables (and save them).
        object.__setattr__(self, "_hora_variables", list(trainable_variables))
        try:
            return super()._backend_apply_gradients(grads, trainable_variables)
        finally:
            object.__setattr__(self, "_hora_variables", None)

    def _clip_gradients(self, grads):
        if self._hora_reducer is not None:
            grads = self._hora_reducer(grads, getattr(self, "_hora_variables", None))
        return super()._clip_gradients(grads)

    def register_local_var(self, var):
        """Keeps ``var``'s gradient out of the reduction (a variable this
        rank trains on its own); it is divided by ``size()`` when
        ``scale_local_gradients``, as in Horovod."""
        self._hora_reducer.register_local(var)


class _DistributedLossScaleOptimizer:
    """The same for ``keras.optimizers.LossScaleOptimizer``: reduce the
    scaled gradients before the finiteness check."""

    _hora_settings: dict[str, Any] = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._hora_setup()

    def _hora_setup(self):
        self._hora_reducer = GradientReducer(what=f"DistributedOptimizer({self.name})",
                                             **self._hora_settings)
        # load_model's custom objects also turn the inner optimizer into a
        # hora one; reducing twice would only cost time
        if isinstance(self.inner_optimizer, _DistributedOptimizer):
            self.inner_optimizer._hora_reducer = None

    def apply(self, grads, trainable_variables=None):
        variables = (list(trainable_variables) if trainable_variables is not None
                     else getattr(self, "_trainable_variables", None))
        return super().apply(self._hora_reducer(list(grads), variables), trainable_variables)

    def register_local_var(self, var):
        """Keeps ``var``'s gradient out of the reduction, as Horovod's."""
        self._hora_reducer.register_local(var)


def distributed_class(cls: type, settings: dict[str, Any]) -> type[Any]:
    """A subclass of the Keras optimizer class ``cls`` (Keras 3 or Keras 2)
    that reduces its gradients with ``settings`` (keyword arguments of
    GradientReducer)."""
    if isinstance(cls, type) and is_tf_keras(cls):
        return distributed_class_keras2(cls, settings)
    import keras

    if not (isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)):
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer (keras.optimizers."
                        f"Optimizer, or tf_keras's), got {getattr(cls, '__name__', cls)}")
    if issubclass(cls, (_DistributedOptimizer, _DistributedLossScaleOptimizer)):
        raise ValueError(f"{cls.__name__} is already a hora DistributedOptimizer")
    mixin: type
    if issubclass(cls, keras.optimizers.LossScaleOptimizer):
        mixin = _DistributedLossScaleOptimizer
    else:
        mixin = _DistributedOptimizer
        if not callable(getattr(cls, "_clip_gradients", None)):
            raise RuntimeError(
                f"this Keras ({keras.__version__}) has no Optimizer._clip_gradients, where hora "
                f"reduces gradients; please report it with your Keras version")
    return type(cls.__name__, (mixin, cls), {
        "__module__": cls.__module__, "__qualname__": cls.__qualname__,
        "_hora_settings": dict(settings)})


def adopt(optimizer: Any, settings: dict[str, Any]) -> None:
    """Turns ``optimizer`` (Keras 3 or Keras 2, with its state) into a hora
    DistributedOptimizer in place, unless it is one already: what
    ``load_model`` does to an optimizer saved without hora, whose variables
    were already restored and must not be rebuilt."""
    if is_tf_keras(optimizer):
        adopt_keras2(optimizer, settings)
        return
    if isinstance(optimizer, (_DistributedOptimizer, _DistributedLossScaleOptimizer)):
        return
    # the same object as a subclass of its class; Keras's attribute
    # tracking must not see the assignment
    object.__setattr__(optimizer, "__class__", distributed_class(type(optimizer), settings))
    optimizer._hora_setup()


def DistributedOptimizer(optimizer: Any, name: str | None = None,
                         device_dense: str = "", device_sparse: str = "",
                         compression: type[Compressor] = Compression.none,
                         sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                         op: ReduceOp | int = Average, backward_passes_per_step: int = 1,
                         average_aggregated_gradients: bool = False, num_groups: int = 0,
                         groups: int | None = None,
                         process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True, *,
                         sharding: str | None = None) -> Any:
    """Returns a Keras optimizer that averages gradients over all ranks, or
    over the ranks of ``process_set``.
    ``optimizer`` is a Keras 3 optimizer, or a Keras 2 one (``tf_keras``,
    including its legacy optimizers; see
    :mod:`hora.tensorflow.keras.optimizer_keras2` for where those reduce).

    ``compression`` casts for the wire (``Compression.fp16``);
    ``sparse_as_dense`` makes ``tf.IndexedSlices`` dense before reducing
    (otherwise they are gathered); ``op`` is Average (default) or Sum;
    ``gradient_predivide_factor`` divides before the sum and the rest after;
    ``backward_passes_per_step=N`` accumulates N batches locally and reduces
    once per update, summing them unless ``average_aggregated_gradients``;
    ``groups`` (an int; ``num_groups`` is its deprecated spelling) splits
    the gradients, in order, into that many contiguous fused units, as
    Horovod does.
    ``register_local_var(var)`` keeps a variable's gradient local (divided
    by ``size()`` when ``scale_local_gradients``, the default, as Horovod).
    With ``process_set`` the gradients are averaged among that set's ranks
    (local gradients divided by its size); as in Horovod, a process outside
    the set trains on its own gradients, unreduced.
    ``name`` renames the optimizer; ``device_*`` are accepted for Horovod
    compatibility. Raises ``TypeError`` for anything but a Keras optimizer
    (or a process set that is not a ``hora.ProcessSet``) and ``ValueError``
    for bad settings (an unregistered process set among them).
    ``sharding`` (hora's) is accepted only as None: sharded training state
    is PyTorch-only (``NotImplementedError`` says why; docs/sharding.md)."""
    what = "DistributedOptimizer"
    check_keras_sharding(sharding)
    steps = check_backward_passes(backward_passes_per_step, what)
    # resolved here, so that the num_groups warning is given once, not again
    # by every optimizer built from the settings
    resolved = resolve_groups(groups, num_groups, what, stacklevel=2)
    if resolved is not None and not isinstance(resolved, int):
        raise ValueError(f"{what}: groups must be an int number of groups for Keras optimizers "
                         f"(lists of variables are supported by DistributedGradientTape)")
    settings: dict[str, Any] = dict(
        compression=compression, sparse_as_dense=sparse_as_dense, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=resolved,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    GradientReducer(what=what, **settings)  # raises for bad settings before anything is built
    if is_tf_keras(optimizer):
        return distributed_optimizer_keras2(optimizer, name, settings, steps,
                                            average_aggregated_gradients)
    import keras

    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer wraps a Keras optimizer (keras.optimizers."
                        f"Optimizer, or tf_keras's), got {type(optimizer).__name__}")
    if (not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
            and keras.mixed_precision.global_policy().name == "mixed_float16"):
        # compile() would wrap the optimizer in a LossScaleOptimizer, whose
        # finiteness check on each rank's own gradients would then decide
        # whether that rank joins the allreduce. Wrap it here instead and
        # reduce before the check, so every rank decides alike.
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    if steps > 1:
        # Keras accumulates in the optimizer that applies the gradients:
        # for a LossScaleOptimizer, its inner one. hora then reduces every
        # backward pass (before the finiteness check, as always), and the
        # inner optimizer accumulates the reduced passes.
        accumulating = config
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            accumulating = config["inner_optimizer"]["config"]
        current = accumulating.get("gradient_accumulation_steps")
        if current and current != steps:
            raise ValueError(f"the optimizer already accumulates over {current} steps but "
                             f"backward_passes_per_step is {steps}; set only one of them")
        accumulating["gradient_accumulation_steps"] = steps
        if not average_aggregated_gradients:
            # Keras averages the accumulated passes; Horovod sums them
            settings["extra_postscale"] = float(steps)
    return distributed_class(type(optimizer), settings).from_config(config)


def check_keras_sharding(sharding: Any) -> None:
    """``sharding=`` of the Keras optimizer: only None (replicated)."""
    if sharding is None:
        return
    if sharding not in ("optimizer_state", "gradients", "parameters"):
        raise ValueError(f"DistributedOptimizer: sharding must be None, 'optimizer_state', "
                         f"'gradients' or 'parameters', got {sharding!r}")
    raise NotImplementedError(
        f"DistributedOptimizer(sharding={sharding!r}) is PyTorch-only (hora.torch). A Keras "
        f"optimizer creates its state variables with the shapes of the model's variables and "
        f"updates them inside its own compiled apply(); stepping a slice of each variable "
        f"would mean replacing those variables with per-rank slices and gathering the "
        f"updated variables after every apply(), which Keras offers no seam for. Use "
        f"sharding=None (replicated), or hora.torch for sharded training")


def PartialDistributedOptimizer(optimizer: Any, name: str | None = None,
                                device_dense: str = "", device_sparse: str = "",
                                compression: type[Compressor] = Compression.none,
                                sparse_as_dense: bool = False,
                                gradient_predivide_factor: float = 1.0,
                                op: ReduceOp | int = Average, backward_passes_per_step: int = 1,
                                average_aggregated_gradients: bool = False,
                                groups: int | None = None,
                                process_set: ProcessSet = global_process_set,
                                local_layers: Any = None,
                                scale_local_gradients: bool = True) -> Any:
    """:func:`DistributedOptimizer` whose ``local_layers`` (a Keras layer or
    a list of them) keep their gradients local, as Horovod's: their
    trainable weights are registered with ``register_local_var``. Raises
    ``ValueError`` when an entry of ``local_layers`` is not a Keras layer."""
    from hora.tensorflow.gradient_tape import local_layer_variables

    local = local_layer_variables(local_layers)
    wrapped = DistributedOptimizer(
        optimizer, name=name, device_dense=device_dense, device_sparse=device_sparse,
        compression=compression, sparse_as_dense=sparse_as_dense,
        gradient_predivide_factor=gradient_predivide_factor, op=op,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients, groups=groups,
        process_set=process_set, scale_local_gradients=scale_local_gradients)
    for variable in local:
        wrapped.register_local_var(variable)
    return wrapped
