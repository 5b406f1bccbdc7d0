"""Which Keras the Keras face serves, and the few places where Keras 3 and
Keras 2 differ for hora.

``hora.tensorflow.keras`` serves the Keras that ``tf.keras`` is: Keras 3
(the ``keras`` package) by default on TensorFlow 2.16+, or Keras 2 (the
``tf_keras`` package) when ``TF_USE_LEGACY_KERAS=1`` is set before
TensorFlow is imported, which is how Horovod's Keras scripts run on current
TensorFlow. TensorFlow reads that variable; hora asks ``tf.keras`` which
one it chose by the package its classes come from, which is what a user's
``tf.keras.Model`` and ``model.fit`` are made of. The module's name cannot
tell: ``from tensorflow.keras.optimizers import Optimizer`` run before hora
is imported makes ``tf.keras`` the ``tf_keras`` module under the name
``tensorflow.keras``. The optimizer wrapper recognizes optimizers of either
Keras by their class, so only the callbacks, ``SyncBatchNormalization`` and
``load_model`` follow this choice.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def is_tf_keras(obj: Any) -> bool:
    """Whether ``obj`` (an instance or a class) comes from Keras 2 (``tf_keras``)."""
    cls = obj if isinstance(obj, type) else type(obj)
    return any(c.__module__.startswith("tf_keras.") for c in cls.__mro__)


try:
    #: True when ``tf.keras`` is Keras 2 (``tf_keras``): its callbacks, the
    #: base of hora's, are Keras 2 classes.
    LEGACY = is_tf_keras(tf.keras.callbacks.Callback)
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("tf.keras cannot be imported; with TF_USE_LEGACY_KERAS=1 it is Keras 2, "
                      "from the tf_keras package: pip install tf_keras") from error

if LEGACY:
    import tf_keras as keras  # already imported: tf.keras's classes come from it
else:
    import keras

__all__ = ["LEGACY", "is_tf_keras", "keras", "learning_rate", "momentum_buffers",
           "optimizer_variables", "set_learning_rate"]


def _inner(optimizer: Any) -> Any:
    """The optimizer a loss-scale optimizer wraps, or ``optimizer``."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def optimizer_variables(optimizer: Any, trainable_variables: list[Any]) -> list[Any]:
    """The variables of ``optimizer`` (Keras 3, Keras 2 or Keras 2's legacy
    optimizers), creating them for ``trainable_variables`` first if the
    optimizer has not run yet, so that every rank has the same list."""
    import tensorflow as tf
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):  # TF1's: its slots, as they are
        return list(optimizer.variables())
    if hasattr(optimizer, "_create_all_weights"):  # Keras 2 legacy (OptimizerV2)
        optimizer._create_all_weights(list(trainable_variables))
    elif not getattr(optimizer, "built", getattr(optimizer, "_built", False)):
        optimizer.build(list(trainable_variables))
    found = optimizer.variables
    return list(found() if callable(found) else found)


def _learning_rate_holder(optimizer: Any) -> Any:
    inner = _inner(optimizer)
    if hasattr(inner, "_hyper"):  # Keras 2 legacy keeps it among the hyperparameters
        value = inner._hyper.get("learning_rate")
    else:
        value = inner._learning_rate
    if isinstance(value, (int, float)) or hasattr(value, "assign"):
        return value
    raise ValueError(f"the learning rate of {type(inner).__name__} is a "
                     f"{type(value).__name__}; give the optimizer a float learning_rate "
                     f"instead of a schedule")


def learning_rate(optimizer: Any) -> float:
    """The optimizer's current learning rate; ``ValueError`` if it is a
    schedule."""
    value = _learning_rate_holder(optimizer)
    return float(value.numpy() if hasattr(value, "numpy") else value)


def set_learning_rate(optimizer: Any, value: float) -> None:
    """Sets the learning rate (a variable, or a Keras 2 legacy hyperparameter)."""
    holder = _learning_rate_holder(optimizer)
    if hasattr(holder, "assign"):
        holder.assign(value)
    else:
        _inner(optimizer)._set_hyper("learning_rate", value)


def momentum_buffers(optimizer: Any) -> list[Any]:
    """The momentum variables of an SGD-style optimizer (empty if none)."""
    inner = _inner(optimizer)
    if hasattr(inner, "_slots"):  # Keras 2 legacy: per-variable slots
        return [slots["momentum"] for slots in inner._slots.values() if "momentum" in slots]
    return list(getattr(inner, "momentums", None) or [])
