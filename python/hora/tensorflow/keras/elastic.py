"""Elastic training with Keras ``model.fit``, Horovod's
``horovod.tensorflow.keras.elastic`` (also ``hora.keras.elastic``):
``KerasState`` and the callbacks that keep it current.

Put the callbacks in this order, so that a commit records the batch and
epoch that just ended::

    callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]
"""

from __future__ import annotations

from typing import Any

from hora.common.elastic import ObjectState, State, run
from hora.common.exceptions import HorovodInternalError, HoraInternalError, HostsUpdatedInterrupt
from hora.tensorflow.elastic import TensorFlowKerasState
from hora.tensorflow.keras._flavor import keras

__all__ = [
    "CommitStateCallback", "HoraInternalError", "HorovodInternalError", "HostsUpdatedInterrupt",
    "KerasState", "ObjectState", "State", "UpdateBatchStateCallback", "UpdateEpochStateCallback",
    "run"]


class KerasState(TensorFlowKerasState):
    """Elastic state of a compiled Keras model (weights and optimizer), plus
    any picklable attributes given as keywords (``epoch=0, batch=0``);
    ``state.backend`` is Keras's backend module, as in Horovod."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any):
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commits ``state`` every ``batches_per_commit`` batches and at the end
    of every epoch."""

    def __init__(self, state: State, batches_per_commit: int = 1):
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Any = None) -> None:
        # every rank counts from the same point after a new world starts
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.commit()

    def commit(self) -> None:
        """Commits the state (Horovod's hook: a subclass may override it)."""
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """Keeps ``state.batch`` at the batch just finished (0 at an epoch's
    end), and shortens the first epoch after a resume to the steps it had
    left where Keras lets a callback do so."""

    def __init__(self, state: ObjectState):
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.steps_per_epoch = None

    def on_train_begin(self, logs: Any = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        params = getattr(self, "params", None) or {}
        if params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = params["steps"]
            params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """Keeps ``state.epoch`` at the number of epochs completed, counted
    across resets (Keras counts each ``fit`` call's epochs from 0)."""

    def __init__(self, state: ObjectState):
        super().__init__()
        self.backend = keras.backend
        self.state = state
        self.initial_epoch = state.epoch

    def on_train_begin(self, logs: Any = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1
