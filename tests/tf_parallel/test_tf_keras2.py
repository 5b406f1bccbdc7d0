"""Keras 2 (tf_keras), how Horovod's Keras scripts run on TensorFlow 2.16+
with TF_USE_LEGACY_KERAS=1: DistributedOptimizer around tf_keras optimizers,
their legacy optimizers and a custom subclass trains like one process on
the global batch (with backward_passes_per_step too), mixed precision keeps
the ranks together, load_model wraps plain-saved optimizers of both kinds,
the callbacks work on legacy optimizers, PartialDistributedOptimizer keeps
its layers local. Run by the TF_USE_LEGACY_KERAS=1 jobs of
tests/test_tensorflow_suite.py; skipped in the Keras 3 jobs."""

import os

import keras_helpers
import numpy as np
import pytest
import tensorflow as tf
from keras_helpers import BATCH, STEPS, assert_same_on_every_rank, global_batches, rank_data

import hora.tensorflow as hvd
import hora.tensorflow.keras as hk
from hora.tensorflow.keras import _flavor

pytestmark = pytest.mark.skipif(
    not _flavor.LEGACY, reason="Keras 2 tests; tests/test_tensorflow_suite.py runs them with "
                               "TF_USE_LEGACY_KERAS=1")

keras = tf.keras


class MySGD(keras.optimizers.SGD):
    """A user's optimizer subclass (Horovod wraps those as well)."""


def make_optimizer(kind, lr, momentum):
    if kind == "legacy":
        return keras.optimizers.legacy.SGD(lr, momentum=momentum)
    if kind == "custom":
        return MySGD(lr, momentum=momentum)
    return keras.optimizers.SGD(lr, momentum=momentum)


def make_model(seed):
    return keras_helpers.make_model(keras, seed)


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_tf_keras_is_the_keras_served():
    import tf_keras

    assert keras.optimizers.SGD is tf_keras.optimizers.SGD
    assert issubclass(hk.callbacks.BroadcastGlobalVariablesCallback, tf_keras.callbacks.Callback)
    assert issubclass(hvd.SyncBatchNormalization, tf_keras.layers.BatchNormalization)


@pytest.mark.parametrize("kind", ["new", "legacy", "custom"])
@pytest.mark.parametrize("passes", [1, 2])
def test_fit_matches_single_process_on_the_global_batch(kind, passes, rank, size):
    x, y = rank_data(size, batches=STEPS * passes)
    model = make_model(seed=1 + rank)  # different starting points: the callback equalizes them
    reference = make_model(seed=1)
    opt = hk.DistributedOptimizer(make_optimizer(kind, 0.1, 0.9),
                                  backward_passes_per_step=passes,
                                  average_aggregated_gradients=True)
    assert isinstance(opt, type(make_optimizer(kind, 0.1, 0.9)))
    model.compile(optimizer=opt, loss=loss_fn())
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0, at_train_begin=True)])
    reference.compile(optimizer=make_optimizer(kind, 0.1, 0.9), loss=loss_fn())
    gx, gy = global_batches(x, y, BATCH * passes)
    reference.fit(gx, gy, batch_size=BATCH * passes * size, epochs=1, shuffle=False, verbose=0)
    assert_same_on_every_rank(model.get_weights())
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    # as Horovod, every pass counts as an iteration
    assert int(opt.iterations.numpy()) == STEPS * passes


def test_accumulated_gradients_are_summed_by_default(rank, size):
    var = tf.Variable([0.0, 0.0])
    opt = hk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=2)
    for step in range(2):
        weight = float(rank + 1 + step)
        opt.minimize(lambda weight=weight: tf.reduce_sum(var * weight), [var])
        if step == 0:  # the first pass only accumulates
            np.testing.assert_array_equal(var.numpy(), [0.0, 0.0])
    mean_rank = np.mean([r + 1 for r in range(size)])
    np.testing.assert_allclose(var.numpy(), -(2 * mean_rank + 1) * np.ones(2), rtol=1e-6)


def test_mixed_precision_keeps_the_ranks_together(rank, size):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = make_model(seed=60)
        model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                      loss=loss_fn())
        assert isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)
        x, y = rank_data(size)
        model.fit(x[rank], y[rank], batch_size=BATCH, verbose=0,
                  callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)])
        assert_same_on_every_rank(model.get_weights())
        assert_same_on_every_rank([model.optimizer.loss_scale.numpy()])
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("kind", ["new", "legacy"])
@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_load_model_wraps_plain_saved_optimizers(kind, suffix, rank, size, tmp_path):
    model = make_model(seed=40)
    model.compile(optimizer=make_optimizer(kind, 0.05, 0.9), loss=loss_fn())
    x, y = rank_data(size)
    model.fit(x[0], y[0], batch_size=BATCH, verbose=0)
    path = os.path.join(str(tmp_path), f"model-rank{rank}{suffix}")
    model.save(path)
    loaded = hk.load_model(path, legacy_opts=kind == "legacy")
    assert hasattr(loaded.optimizer, "register_local_var")
    assert isinstance(loaded.optimizer, type(make_optimizer(kind, 0.05, 0.9)))
    plain = keras.models.load_model(path)
    # the optimizer state is what plain Keras restores: all of it, except
    # that tf_keras does not restore a legacy optimizer from a .keras file
    assert int(loaded.optimizer.iterations.numpy()) == int(plain.optimizer.iterations.numpy())
    if not (kind == "legacy" and suffix == ".keras"):
        assert int(loaded.optimizer.iterations.numpy()) == STEPS
    loaded.fit(x[rank], y[rank], batch_size=BATCH, verbose=0)
    assert_same_on_every_rank(loaded.get_weights())


class LearningRates(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batch_lr = []

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_lr.append(_flavor.learning_rate(self.model.optimizer))


@pytest.mark.parametrize("kind", ["new", "legacy"])
def test_warmup_and_metric_average_with_keras2_optimizers(kind, rank, size):
    model = make_model(seed=30)
    model.compile(optimizer=hk.DistributedOptimizer(make_optimizer(kind, 0.4, 0.5)),
                  loss=loss_fn())
    x, y = rank_data(size, batches=4)
    recorder = LearningRates()
    history = model.fit(x[rank], y[rank], batch_size=BATCH, epochs=3, verbose=0, callbacks=[
        hk.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2),
        hk.callbacks.MetricAverageCallback(), recorder])
    expected = [0.4 / size * ((e + (b + 1) / 4) * (size - 1) / 2 + 1)
                for e in range(2) for b in range(4)]
    np.testing.assert_allclose(recorder.batch_lr[:8], expected, rtol=1e-6)
    np.testing.assert_allclose(recorder.batch_lr[8:], [0.4] * 4, rtol=1e-6)
    assert_same_on_every_rank([history.history["loss"]])


def test_momentum_correction_rescales_legacy_sgd_slots():
    model = make_model(seed=31)
    model.compile(optimizer=keras.optimizers.legacy.SGD(0.1, momentum=0.9), loss=loss_fn())
    model.optimizer._create_all_weights(model.trainable_variables)
    buffers = _flavor.momentum_buffers(model.optimizer)
    assert len(buffers) == len(model.trainable_variables)
    for buffer in buffers:
        buffer.assign(tf.ones_like(buffer))
    schedule = hk.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5)
    schedule.set_model(model)
    schedule._set_learning_rate(0.05)
    assert _flavor.learning_rate(model.optimizer) == pytest.approx(0.05)
    for buffer in buffers:
        np.testing.assert_allclose(buffer.numpy(), 0.5)


@pytest.mark.parametrize("kind", ["new", "legacy"])
def test_partial_distributed_optimizer_keeps_local_layers_local(kind, rank, size):
    keras.utils.set_random_seed(80)
    shared, local = keras.layers.Dense(2), keras.layers.Dense(1)
    model = keras.Sequential([keras.Input((3,)), shared, local])
    start = [w.copy() for w in model.get_weights()]
    opt = hk.PartialDistributedOptimizer(make_optimizer(kind, 1.0, 0.0), local_layers=[local])
    x = tf.constant(np.full((2, 3), rank + 1.0, np.float32))
    grads = {}
    for r in range(size):  # every rank's gradient, from its own input
        copy = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
        copy.set_weights(start)
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(copy(tf.constant(np.full((2, 3), r + 1.0, np.float32))))
        grads[r] = [g.numpy() for g in tape.gradient(value, copy.trainable_variables)]
    opt.minimize(lambda: tf.reduce_sum(model(x)), model.trainable_variables)
    for i, (got, before) in enumerate(zip(model.get_weights(), start)):
        if i < 2:  # the shared layer: the gradient averaged over the ranks
            want = before - np.mean([grads[r][i] for r in range(size)], axis=0)
        else:  # the local layer: this rank's gradient divided by size(), as Horovod
            want = before - grads[rank][i] / size
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
