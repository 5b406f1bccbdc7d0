"""DistributedGradientTape: a ``tf.GradientTape`` whose ``gradient``
returns gradients averaged over all ranks (or the ranks of a process set)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora.common.basics import Average, ReduceOp
from hora.common.compression import Compressor
from hora.common.process_sets import ProcessSet, global_process_set
from hora.tensorflow.compression import Compression
from hora.tensorflow.gradients import GradientReducer


# _DistributedTape's base, to a type checker: the wrapped tape's class,
# which it knows nothing of (TensorFlow is read untyped).
_Tape: Any = object


class _DistributedTape(_Tape):
    """Mixed in before the wrapped tape's class; shares the tape's state."""

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 use_generic_names: bool = False,
                 unconnected_gradients: tf.UnconnectedGradients = tf.UnconnectedGradients.NONE
                 ) -> Any:
        """The tape's gradients of ``target`` with respect to ``sources``,
        reduced over all ranks, or those of the tape's process set (a
        collective: each of them must call it). Horovod's signature:
        ``use_generic_names`` is accepted and changes nothing (hora names
        the gradients' collectives by position anyway, the same on every
        rank); ``unconnected_gradients`` is the tape's. A list or tuple of
        sources gives a list, as Horovod's; other structures keep theirs."""
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)
        flat_grads = tf.nest.flatten(grads)
        flat_sources = tf.nest.flatten(sources)
        reduced = self._hora_reducer(flat_grads, flat_sources)
        if isinstance(sources, (list, tuple)) and len(flat_sources) == len(sources):
            return list(reduced)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target: Any, sources: Any,
                                       output_gradients: Any = None,
                                       use_generic_names: bool = False
                                       ) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """Horovod's: :meth:`gradient`, split into the ``(source, gradient)``
        pairs of the local sources (``register_local_source``,
        ``local_layers``) and those of the others, each in ``sources``'
        order."""
        gradients = self.gradient(target, sources, output_gradients, use_generic_names)
        local: list[tuple[Any, Any]] = []
        reduced: list[tuple[Any, Any]] = []
        for source, grad in zip(tf.nest.flatten(sources), tf.nest.flatten(gradients)):
            (local if self._hora_reducer.is_local(source) else reduced).append((source, grad))
        return local, reduced

    def register_local_source(self, source: tf.Variable) -> None:
        """Keeps ``source``'s gradient out of the reduction (a variable this
        rank trains on its own); it is divided by ``size()`` (the process
        set's size) when ``scale_local_gradients``, as in Horovod."""
        self._hora_reducer.register_local(source)


def local_layer_variables(local_layers: Any) -> list[tf.Variable]:
    """The trainable weights of ``local_layers`` (None, a Keras layer or a
    list of them), as Horovod's ``PartialDistributed*`` take them."""
    import sys

    # layers of whichever Keras the program uses (Keras 3, or Keras 2 from tf_keras)
    layer_types = tuple(sys.modules[name].layers.Layer for name in ("keras", "tf_keras")
                        if name in sys.modules)
    if local_layers is None:
        return []
    if isinstance(local_layers, layer_types):
        local_layers = [local_layers]
    local_layers = list(local_layers)
    if not all(isinstance(layer, layer_types) for layer in local_layers):
        raise ValueError("All local layers must be of tf.keras.layers.Layer type.")
    return [v for layer in local_layers for v in layer.trainable_weights]


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                            device_sparse: str = "",
                            compression: type[Compressor] = Compression.none,
                            sparse_as_dense: bool = False, op: ReduceOp | int = Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: int | list[list[tf.Variable]] | None = None,
                            process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """Wraps ``gradtape`` (after its ``with`` block, as in Horovod) so that
    ``gradient()`` averages the gradients over all ranks before returning them.

    ``compression`` casts for the wire (``Compression.fp16``);
    ``sparse_as_dense`` turns ``tf.IndexedSlices`` into dense tensors
    instead of gathering them; ``op`` is Average (default) or Sum;
    ``gradient_predivide_factor`` divides before the sum and the rest after;
    ``groups`` is an int (the gradients, in order, split into that many
    contiguous fused units, as Horovod does) or a list of variable lists
    reduced as units (``num_groups`` is its deprecated spelling). The
    result is an instance of a subclass of the tape's class, so it is still
    a ``tf.GradientTape``; ``register_local_source(variable)`` keeps a
    variable's gradient local (divided by ``size()`` when
    ``scale_local_gradients``, the default, as in Horovod). With
    ``process_set`` the gradients are averaged among that set's ranks (and
    local gradients divided by its size); as in Horovod, a process outside
    the set gets its own gradients back unreduced.
    Raises ``ValueError`` for a bad op, factor, groups or an unregistered
    process set, ``TypeError`` for a process set that is not a
    ``hora.ProcessSet``."""
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"DistributedGradientTape wraps a tf.GradientTape, got "
                        f"{type(gradtape).__name__}")
    reducer = GradientReducer(compression, sparse_as_dense, op, gradient_predivide_factor,
                              groups, num_groups, process_set, what="DistributedGradientTape",
                              stacklevel=2, scale_local_gradients=scale_local_gradients)
    cls: Any = type(gradtape.__class__.__name__, (_DistributedTape, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)
    tape._hora_reducer = reducer
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "",
                                   device_sparse: str = "",
                                   compression: type[Compressor] = Compression.none,
                                   sparse_as_dense: bool = False, op: ReduceOp | int = Average,
                                   gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                                   groups: int | list[list[tf.Variable]] | None = None,
                                   process_set: ProcessSet = global_process_set,
                                   local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """:func:`DistributedGradientTape` whose ``local_layers`` (a Keras layer
    or a list of them) keep their gradients local: their trainable weights
    are registered with ``register_local_source``. Raises ``ValueError``
    when an entry of ``local_layers`` is not a Keras layer."""
    local = local_layer_variables(local_layers)
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression,
                                   sparse_as_dense, op, gradient_predivide_factor, num_groups,
                                   groups, process_set, scale_local_gradients)
    for variable in local:
        tape.register_local_source(variable)
    return tape
