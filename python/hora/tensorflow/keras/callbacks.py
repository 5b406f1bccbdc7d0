"""Keras callbacks for data-parallel training, with Horovod's names.

Put :class:`BroadcastGlobalVariablesCallback` first and
:class:`MetricAverageCallback` before any callback that reads the metrics
(checkpointing, early stopping, LR plateaus), so those see global values.
"""

import numpy as np

from hora.common import ops as _ops
from hora.common._adapter.checks import check_root
from hora.common.basics import rank, size
from hora.tensorflow.keras._flavor import (
    _inner, keras, learning_rate, momentum_buffers, optimizer_variables, set_learning_rate)
from hora.tensorflow.mpi_ops import broadcast_variables


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Sets every rank's model and optimizer variables to ``root_rank``'s,
    so all ranks continue from the same state (after random initialization
    or a checkpoint loaded on one rank). As in Horovod this happens at the
    end of the first batch, when the optimizer's variables exist; with
    ``at_train_begin=True`` (hora's opt-in) it happens before the first
    batch instead, building the optimizer first, so that the first step
    already starts from the root's weights. ``local_variables`` (a variable
    or a list of them) keep each rank's own values."""

    def __init__(self, root_rank=0, device="", local_variables=None, at_train_begin=False):
        super().__init__()
        self.root_rank = check_root(root_rank, "BroadcastGlobalVariablesCallback")
        self.device = device
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple, set)):
            local_variables = [local_variables]
        self.local_variables = {id(v): v for v in local_variables}
        self.at_train_begin = bool(at_train_begin)
        self.broadcast_done = False

    def _broadcast(self):
        model = self.model
        # model.weights, not model.variables: Keras 3 counts the random
        # seed generators' state among the variables, and broadcasting it
        # would give every rank the same dropout masks
        variables = list(model.weights)
        optimizer = getattr(model, "optimizer", None)
        kept = dict(self.local_variables)
        if optimizer is not None:
            variables += optimizer_variables(optimizer, model.trainable_variables)
            # Keras 3's gradient accumulators hold this rank's own passes
            # so far (Horovod's aggregation buffers are no variables either)
            for accumulator in getattr(_inner(optimizer), "_accumulated_gradients", None) or []:
                kept[id(accumulator)] = accumulator
        variables = [v for v in variables if id(v) not in kept]
        broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True

    def on_train_begin(self, logs=None):
        if self.at_train_begin and not self.broadcast_done:
            self._broadcast()

    def on_train_batch_end(self, batch, logs=None):
        if not self.broadcast_done:
            self._broadcast()


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of each epoch, replaces every numeric value in ``logs``
    (loss, metrics, validation metrics; numbers and arrays, such as a
    per-class metric) by its average over all ranks, so that what is
    printed, checkpointed or acted on is the global value. Ranks whose logs
    hold different keys, or arrays of different shapes, raise
    ``ValueError`` naming them, on every rank."""

    def __init__(self, device=""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if not logs or size() == 1:
            return
        entries = sorted((k, np.shape(v)) for k, v in logs.items() if _is_numeric(v))
        everyone = _ops.allgather_object(entries, name="hora.keras.MetricAverageCallback.keys")
        if any(other != entries for other in everyone):
            differing = sorted({k for k, _ in set().union(*map(set, everyone))
                                - set.intersection(*map(set, everyone))})
            raise ValueError(f"MetricAverageCallback: the ranks logged different metrics at "
                             f"epoch {epoch} (names, or shapes of arrays); not the same on "
                             f"every rank: {differing}")
        values = [np.asarray(logs[k], np.float64).reshape(-1) for k, _ in entries]
        averaged = _ops.allreduce(np.concatenate(values) if values else np.zeros(0),
                                  name="hora.keras.MetricAverageCallback")
        offset = 0
        for (key, shape), value in zip(entries, values):
            mean = averaged[offset:offset + value.size]
            offset += value.size
            if shape == ():
                logs[key] = float(mean[0])
            else:
                logs[key] = mean.reshape(shape).astype(np.asarray(logs[key]).dtype)


def _is_numeric(value):
    """A number, or an array of numbers (a metric's value)."""
    try:
        return np.asarray(value).dtype.kind in "biuf"
    except (TypeError, ValueError):
        return False


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` from
    ``start_epoch`` up to (not including) ``end_epoch``.

    ``multiplier`` is a function of the epoch or, as in Horovod, a number
    ``m`` meaning ``m ** (epoch - start_epoch)`` (exponential decay); with
    ``staircase=False`` the epoch is fractional (``epoch + batch /
    steps_per_epoch``) and the rate changes every batch. With
    ``momentum_correction`` the momentum buffers of an SGD optimizer are
    rescaled by ``new_lr / old_lr`` whenever the rate changes (Goyal et al.,
    2017), which is what scaling the momentum for one step does for plain
    momentum. ``steps_per_epoch`` defaults to what ``fit`` reports. The
    optimizer's learning rate must be a number (a variable), not a
    schedule; ``ValueError`` otherwise."""

    def __init__(self, initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True,
                 momentum_correction=True, steps_per_epoch=None, verbose=0):
        super().__init__()
        self.initial_lr = float(initial_lr)
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            factor = float(multiplier)
            self.multiplier = lambda epoch: factor ** (epoch - start_epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = None

    def _learning_rate(self):
        try:
            return learning_rate(self.model.optimizer)
        except ValueError as error:
            raise ValueError(f"{type(self).__name__} sets the optimizer's learning rate: "
                             f"{error}") from None

    def on_train_begin(self, logs=None):
        if self.steps_per_epoch is None:
            self.steps_per_epoch = (self.params or {}).get("steps")
        if not self.staircase and not self.steps_per_epoch:
            raise ValueError(f"{type(self).__name__}(staircase=False) needs steps_per_epoch; "
                             f"fit() did not report one (pass steps_per_epoch)")
        self._learning_rate()

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def _in_range(self):
        return self.current_epoch >= self.start_epoch and (
            self.end_epoch is None or self.current_epoch < self.end_epoch)

    def _set_learning_rate(self, lr):
        old = self._learning_rate()
        set_learning_rate(self.model.optimizer, lr)
        if self.momentum_correction and old > 0 and lr != old:
            for buffer in momentum_buffers(self.model.optimizer):
                buffer.assign(buffer * (lr / old))

    def on_batch_begin(self, batch, logs=None):
        if self.current_epoch is None or not self._in_range():
            return
        if self.staircase:
            if batch == 0:
                self._set_learning_rate(self.initial_lr * self.multiplier(self.current_epoch))
            return
        epoch = self.current_epoch + float(batch) / self.steps_per_epoch
        self._set_learning_rate(self.initial_lr * self.multiplier(epoch))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            # "lr" as Horovod logs it, "learning_rate" as Keras 3 does
            logs["lr"] = logs["learning_rate"] = self._learning_rate()


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramps the learning rate from ``initial_lr / size()`` up to
    ``initial_lr`` over the first ``warmup_epochs`` epochs, batch by batch
    (Goyal et al., 2017): large global batches train better when the scaled
    rate is reached gradually. ``initial_lr`` is the already scaled rate
    (e.g. ``0.01 * hvd.size()``). As in Horovod, each batch trains at the
    rate of the point of the ramp where it ends, so the last warmup batch
    trains at ``initial_lr``. With ``verbose`` rank 0 prints a line when the
    warmup ends."""

    def __init__(self, initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None,
                 verbose=0):
        def multiplier(epoch):
            # epoch is fractional, at the batch's start; Horovod's ramp
            # reads it at the batch's end
            epoch += 1.0 / self.steps_per_epoch
            return 1.0 / size() * (epoch * (size() - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs,
                         staircase=False, momentum_correction=momentum_correction,
                         steps_per_epoch=steps_per_epoch, verbose=verbose)
        self.warmup_epochs = warmup_epochs

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.warmup_epochs - 1:
            # the last warmup batch set the rate just below the target
            self._set_learning_rate(self.initial_lr)
            if self.verbose and rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                      f"{self.initial_lr:g}.")


class BestModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Horovod's ``ModelCheckpoint`` that keeps only the best model by
    ``monitor`` (``save_best_only=True``). As in Horovod it is made without
    a path, which is set later (``callback.filepath = ...``, as Horovod's
    Spark estimator does) or given here as ``filepath``; ``fit`` raises
    ``ValueError`` if it is still unset. Keras 3 needs the path to end in
    ``.keras`` (``.weights.h5`` with ``save_weights_only``)."""

    def __init__(self, monitor="val_loss", verbose=0, save_weights_only=False, mode="auto",
                 save_freq="epoch", filepath=None):
        # Keras 3 checks the path's suffix when the callback is made; a path
        # set later is checked by the save itself
        checked = filepath or ("best.weights.h5" if save_weights_only else "best.keras")
        super().__init__(filepath=checked, monitor=monitor, verbose=verbose,
                         save_best_only=True, save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq)
        self.filepath = filepath

    def on_train_begin(self, logs=None):
        if not self.filepath:
            raise ValueError("BestModelCheckpoint has no filepath: set callback.filepath (or "
                             "pass filepath=) before fit")
        super().on_train_begin(logs)
