"""Elastic training for TensorFlow 2, Horovod's ``horovod.tensorflow.elastic``:
``hvd.elastic.run``, ``TensorFlowKerasState`` (a Keras model and its
optimizer) and ``TensorFlowState`` (a list of variables). See
``docs/elastic.md``."""

from __future__ import annotations

from typing import Any

import numpy as np

from hora.common.basics import rank
from hora.common.elastic import ObjectState, State, run
from hora.common.exceptions import HorovodInternalError, HoraInternalError, HostsUpdatedInterrupt
from hora.tensorflow.functions import broadcast_object
from hora.tensorflow.mpi_ops import broadcast_variables

__all__ = [
    "HoraInternalError", "HorovodInternalError", "HostsUpdatedInterrupt", "ObjectState", "State",
    "TensorFlowKerasState", "TensorFlowState", "run"]


class _VariablesState(ObjectState):
    """State held in a list of variables, saved as NumPy copies."""

    def _variables(self) -> list[Any]:
        raise NotImplementedError

    def _save_variables(self) -> None:
        import tensorflow as tf
        if not tf.executing_eagerly():
            raise RuntimeError(f"{type(self).__name__}: hora's elastic states run eagerly "
                               f"(TensorFlow 2); a TF1 graph run by a Session is not supported "
                               f"here (Horovod's session= path)")
        self._saved_values = [np.array(v.numpy(), copy=True) for v in self._variables()]

    def _load_variables(self) -> None:
        variables = self._variables()
        if len(variables) != len(self._saved_values):
            raise ValueError(f"{type(self).__name__}: the committed state has "
                             f"{len(self._saved_values)} variables but the model now has "
                             f"{len(variables)}")
        for variable, value in zip(variables, self._saved_values):
            variable.assign(value)

    def save(self) -> None:
        self._save_variables()
        super().save()

    def restore(self) -> None:
        self._load_variables()
        super().restore()

    def sync(self) -> None:
        broadcast_variables(self._variables(), root_rank=0)
        self._save_variables()
        super().sync()

    def snapshot(self) -> Any:
        return {"objects": self._saved_state, "variables": self._saved_values}

    def load_snapshot(self, snapshot: Any) -> None:
        super().load_snapshot(snapshot)
        self._saved_values = list(snapshot["variables"])


class TensorFlowKerasState(_VariablesState):
    """Elastic state of a Keras model and its optimizer (``model.optimizer``
    unless given), plus any picklable attributes given as keywords. The
    model must be built. ``backend`` is accepted for Horovod's signature and
    not needed."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any):
        if not getattr(model, "built", True):
            raise ValueError(f"{type(self).__name__}: the model must be built first "
                             f"(model.build(input_shape), or call it on a batch)")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
        self.backend = backend
        self._save_variables()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self) -> list[Any]:
        # model.weights, not model.variables: Keras 3 counts the seed
        # generators' state among the variables, and sharing it would give
        # every rank the same dropout masks (a tf.Module has variables only)
        weights = getattr(self.model, "weights", None)
        variables = list(self.model.variables if weights is None else weights)
        if self.optimizer is not None:
            from hora.tensorflow.keras._flavor import optimizer_variables

            variables += optimizer_variables(self.optimizer, self.model.trainable_variables)
        return variables


class TensorFlowState(_VariablesState):
    """Elastic state of a list of ``tf.Variable`` s, plus any picklable
    attributes given as keywords. Without variables, those of
    ``tf.compat.v1.global_variables()`` (as Horovod's; none when running
    eagerly, so the state holds the keywords alone). (``session`` is
    accepted for Horovod's signature; TensorFlow 2 runs eagerly and needs
    none.)"""

    def __init__(self, variables: list[Any] | None = None, session: Any = None, **kwargs: Any):
        if variables is None:
            import tensorflow as tf
            variables = tf.compat.v1.global_variables()
        self.variables = list(variables)
        self.session = session
        self._save_variables()
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **kwargs)

    def _variables(self) -> list[Any]:
        return self.variables
