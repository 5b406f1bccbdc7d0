"""Keras features tested through ``tf.keras``, so that they run against
both Keras versions: Keras 3 in the TensorFlow suite's main jobs, Keras 2
(tf_keras) in its TF_USE_LEGACY_KERAS=1 jobs. SyncBatchNormalization equals
batch normalization of the global batch (outputs, input gradients, moving
statistics); BestModelCheckpoint keeps the best epoch; load_model makes an
optimizer saved without hora a distributed one, keeping its state."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import rank_values
from keras_helpers import assert_same_on_every_rank

import hora.tensorflow as hvd
import hora.tensorflow.keras as hk

keras = tf.keras
ROWS, FEATURES = 4, 3


def test_sync_batch_norm_normalizes_over_the_global_batch(rank, size, mode):
    inputs = [rank_values("syncbn-x", r, (ROWS, FEATURES)) for r in range(size)]
    weights = [rank_values("syncbn-w", r, (ROWS, FEATURES)) for r in range(size)]
    layer = hvd.SyncBatchNormalization(momentum=0.5)
    reference = keras.layers.BatchNormalization(momentum=0.5)
    layer.build((None, FEATURES))
    reference.build((None, FEATURES))

    def forward(norm, x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = norm(x, training=True)
            loss = tf.reduce_sum(y * w)
        dx, dgamma = tape.gradient(loss, [x, norm.gamma])
        return y, dx, dgamma

    y, dx, dgamma = mode(forward)(layer, tf.constant(inputs[rank]), tf.constant(weights[rank]))
    ry, rdx, rdgamma = forward(reference, tf.constant(np.concatenate(inputs)),
                               tf.constant(np.concatenate(weights)))
    rows = slice(rank * ROWS, (rank + 1) * ROWS)
    np.testing.assert_allclose(y.numpy(), ry.numpy()[rows], rtol=1e-4, atol=1e-5)
    # the input gradient of the loss summed over all ranks: the allreduce
    # carries every rank's part back
    np.testing.assert_allclose(dx.numpy(), rdx.numpy()[rows], rtol=1e-4, atol=1e-5)
    total_dgamma = hvd.allreduce(dgamma, op=hvd.Sum, name="syncbn.dgamma")
    np.testing.assert_allclose(total_dgamma.numpy(), rdgamma.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.moving_mean.numpy(), reference.moving_mean.numpy(),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(layer.moving_variance.numpy(),
                               reference.moving_variance.numpy(), rtol=1e-5, atol=1e-6)
    # inference uses the moving statistics, as plain batch normalization
    np.testing.assert_allclose(layer(inputs[rank], training=False).numpy(),
                               reference(inputs[rank], training=False).numpy(), rtol=1e-5)


def test_sync_batch_norm_refuses_fused():
    with pytest.raises(ValueError, match="does not support fused=True"):
        hvd.SyncBatchNormalization(fused=True)
    assert hvd.SyncBatchNormalization().name.startswith("sync_batch_normalization")


def small_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def rank_data(rank, rows=8):
    x = rank_values("keras-any-x", rank, (rows, FEATURES))
    return x, x.sum(axis=1, keepdims=True)


class Scores(keras.callbacks.Callback):
    """Logs a made-up "score" per epoch and records the weights after each."""

    def __init__(self, scores):
        super().__init__()
        self.scores = scores
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        logs["score"] = self.scores[epoch]
        self.weights.append([w.copy() for w in self.model.get_weights()])


def test_best_model_checkpoint_keeps_the_best_epoch(rank, tmp_path):
    model = small_model(seed=5)
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse")
    x, y = rank_data(rank)
    checkpoint = hk.callbacks.BestModelCheckpoint(monitor="score", mode="min",
                                                  save_weights_only=True)
    with pytest.raises(ValueError, match="no filepath"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, callbacks=[checkpoint])
    checkpoint.filepath = os.path.join(str(tmp_path), f"best-rank{rank}.weights.h5")
    scores = Scores([3.0, 1.0, 2.0])
    model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[scores, checkpoint])
    best = small_model(seed=6)
    best.load_weights(checkpoint.filepath)
    for got, want in zip(best.get_weights(), scores.weights[1]):  # epoch 1 had the best score
        np.testing.assert_array_equal(got, want)
    assert not np.allclose(scores.weights[1][0], scores.weights[2][0])


def test_load_model_distributes_an_optimizer_saved_without_hora(rank, size, tmp_path):
    model = small_model(seed=7)
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="mse")
    x, y = rank_data(0)  # the same data everywhere: the saved states are equal
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    saved = [v.numpy().copy() for v in model.optimizer.variables]
    path = os.path.join(str(tmp_path), f"plain-rank{rank}.keras")
    model.save(path)
    loaded = hk.load_model(path)
    assert hasattr(loaded.optimizer, "register_local_var")  # a hora DistributedOptimizer
    assert isinstance(loaded.optimizer, keras.optimizers.SGD)
    for got, want in zip(loaded.optimizer.variables, saved):  # momentum and iterations kept
        np.testing.assert_array_equal(got.numpy(), want)
    x, y = rank_data(rank)  # now different data: the reduction keeps the ranks together
    loaded.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert_same_on_every_rank(loaded.get_weights())
    if size > 1:
        plain = keras.models.load_model(path)
        plain.fit(x, y, batch_size=4, epochs=1, verbose=0)
        assert not np.allclose(plain.get_weights()[0], loaded.get_weights()[0])


@pytest.mark.parametrize("sharding", ["optimizer_state", "gradients", "parameters"])
def test_sharding_is_pytorch_only_and_says_why(sharding):
    with pytest.raises(NotImplementedError, match="PyTorch-only.*compiled apply"):
        hk.DistributedOptimizer(keras.optimizers.SGD(0.1), sharding=sharding)
    with pytest.raises(NotImplementedError, match="PyTorch-only"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), sharding=sharding)
    with pytest.raises(ValueError, match="sharding must be None"):
        hk.DistributedOptimizer(keras.optimizers.SGD(0.1), sharding="zero2")
    hk.DistributedOptimizer(keras.optimizers.SGD(0.1), sharding=None)
