"""Keras training with hora: DistributedOptimizer in model.fit and
DistributedGradientTape in a custom loop both end with identical weights on
every rank, equal to single-process training on the concatenated batches;
the callbacks and load_model do what Horovod's do."""

import os

import keras
import keras_helpers
import numpy as np
import pytest
import tensorflow as tf

import hora.keras as hk
import hora.tensorflow as hvd
from hora.tensorflow.keras.optimizer import _DistributedOptimizer
from keras_helpers import BATCH, STEPS, assert_same_on_every_rank, global_batches, rank_data


def make_model(seed):
    return keras_helpers.make_model(keras, seed)


def loss_fn():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.mark.parametrize("passes", [1, 2])
def test_fit_matches_single_process_on_the_global_batch(passes, rank, size):
    x, y = rank_data(size, batches=STEPS * passes)
    model = make_model(seed=1 + rank)  # different starting points: the callback equalizes them
    reference = make_model(seed=1)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                   backward_passes_per_step=passes,
                                   average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss=loss_fn(), jit_compile=False)
    # at_train_begin: the first step already starts from rank 0's weights
    # (Horovod's default broadcasts after the first batch)
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0, at_train_begin=True)])
    reference.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss_fn(),
                      jit_compile=False)
    gx, gy = global_batches(x, y, BATCH * passes)
    reference.fit(gx, gy, batch_size=BATCH * passes * size, epochs=1, shuffle=False, verbose=0)
    assert_same_on_every_rank(model.get_weights())
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_gradient_tape_matches_single_process(rank, size, mode):
    x, y = rank_data(size)
    model, reference = make_model(seed=3), make_model(seed=3)
    opt, ref_opt = keras.optimizers.Adam(0.01), keras.optimizers.Adam(0.01)
    loss = loss_fn()

    def step(xb, yb):
        with tf.GradientTape() as tape:
            value = loss(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, groups=2)
        grads = tape.gradient(value, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
    step = mode(step)
    for i in range(STEPS):
        step(x[rank, i * BATCH:(i + 1) * BATCH], y[rank, i * BATCH:(i + 1) * BATCH])
    gx, gy = global_batches(x, y, BATCH)
    global_batch = BATCH * size
    for i in range(STEPS):
        with tf.GradientTape() as tape:
            value = loss(gy[i * global_batch:(i + 1) * global_batch],
                         reference(gx[i * global_batch:(i + 1) * global_batch], training=True))
        ref_opt.apply(tape.gradient(value, reference.trainable_variables),
                      reference.trainable_variables)
    assert_same_on_every_rank(model.get_weights())
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_tape_reduces_embedding_gradients_sparse_and_dense(rank, size):
    table = tf.Variable(np.zeros((size + 1, 2), np.float32))
    for sparse_as_dense in (False, True):
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(tf.gather(table, [rank, rank + 1]) * (rank + 1))
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
        grad = tape.gradient(value, [table])[0]
        assert isinstance(grad, tf.IndexedSlices) != sparse_as_dense
        expected = np.zeros((size + 1, 2))
        for r in range(size):
            expected[[r, r + 1]] += (r + 1) / size
        np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), expected, rtol=1e-6)


def test_tape_groups_sparse_and_dense_gradients_together(rank, size, mode):
    """groups=2 splits the four gradients (one of them tf.IndexedSlices) the
    way Horovod does, [table, w1] and [w2, w3]: the first group's dense part
    is w1 alone. Every gradient still comes back averaged."""
    table = tf.Variable(np.zeros((size + 1, 2), np.float32))
    weights = [tf.Variable(np.zeros(3, np.float32)) for _ in range(3)]

    def gradients():
        with tf.GradientTape() as tape:
            value = tf.reduce_sum(tf.gather(table, [rank]) * (rank + 1))
            for k, w in enumerate(weights):
                value += tf.reduce_sum(w * float(rank + k))
        tape = hvd.DistributedGradientTape(tape, groups=2)
        return tape.gradient(value, [table] + weights)
    grads = mode(gradients)()
    expected_table = np.zeros((size + 1, 2))
    for r in range(size):
        expected_table[r] += (r + 1) / size
    np.testing.assert_allclose(tf.convert_to_tensor(grads[0]).numpy(), expected_table, rtol=1e-6)
    for k, grad in enumerate(grads[1:]):
        np.testing.assert_allclose(grad.numpy(), np.full(3, (size - 1) / 2 + k), rtol=1e-6)


def test_broadcast_callback_equalizes_models_and_optimizer(rank, size):
    model = make_model(seed=10 + rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.0)),
                  loss=loss_fn(), jit_compile=False)
    root_weights = make_model(seed=10).get_weights()
    x, y = rank_data(size, batches=1)
    model.fit(x[rank], y[rank], batch_size=BATCH, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(root_rank=0)])
    for got, want in zip(model.get_weights(), root_weights):
        np.testing.assert_allclose(got, want, atol=1e-7)  # learning rate 0: still rank 0's
    assert_same_on_every_rank([v.numpy() for v in model.optimizer.variables])


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.epoch_logs, self.batch_lr = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))

    def on_train_batch_begin(self, batch, logs=None):
        self.batch_lr.append(float(self.model.optimizer.learning_rate.numpy()))


def test_metric_average_callback_gives_the_global_mean(rank, size):
    model = make_model(seed=20)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=loss_fn(), metrics=["accuracy"], jit_compile=False)
    x, y = rank_data(size)
    local, averaged = Recorder(), Recorder()
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=2, verbose=0,
              validation_data=(x[rank][:4], y[rank][:4]),
              callbacks=[local, hk.callbacks.MetricAverageCallback(), averaged])
    everyone = hvd.allgather_object(local.epoch_logs)
    for epoch, logs in enumerate(averaged.epoch_logs):
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            expected = np.mean([ranks_logs[epoch][key] for ranks_logs in everyone])
            assert logs[key] == pytest.approx(expected, rel=1e-6), key


def test_warmup_ramps_from_lr_over_size_to_lr(rank, size):
    model = make_model(seed=30)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.4, momentum=0.5)),
                  loss=loss_fn(), jit_compile=False)
    x, y = rank_data(size, batches=4)
    recorder = Recorder()
    warmup = hk.callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=3, verbose=0,
              callbacks=[warmup, recorder])
    # as Horovod's: a batch trains at the ramp's value where it ends
    expected = [0.4 / size * ((e + (b + 1) / 4) * (size - 1) / 2 + 1)
                for e in range(2) for b in range(4)]
    np.testing.assert_allclose(recorder.batch_lr[:8], expected, rtol=1e-6)
    np.testing.assert_allclose(recorder.batch_lr[8:], [0.4] * 4, rtol=1e-6)


def test_momentum_correction_rescales_sgd_velocity():
    model = make_model(seed=31)
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss_fn())
    model.optimizer.build(model.trainable_variables)
    for buffer in model.optimizer.momentums:
        buffer.assign(tf.ones_like(buffer))
    schedule = hk.callbacks.LearningRateScheduleCallback(0.1, multiplier=0.5)
    schedule.set_model(model)
    schedule._set_learning_rate(0.05)
    for buffer in model.optimizer.momentums:
        np.testing.assert_allclose(buffer.numpy(), 0.5)


def test_load_model_wraps_the_optimizer_again(rank, size, tmp_path):
    model = make_model(seed=40)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.01)),
                  loss=loss_fn(), jit_compile=False)
    x, y = rank_data(size)
    model.fit(x[rank], y[rank], batch_size=BATCH, verbose=0)
    path = os.path.join(str(tmp_path), f"model-rank{rank}.keras")
    model.save(path)
    plain = keras.models.load_model(path)
    assert type(plain.optimizer) is keras.optimizers.Adam
    loaded = hk.load_model(path)
    assert isinstance(loaded.optimizer, _DistributedOptimizer)
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert int(loaded.optimizer.iterations.numpy()) == STEPS
    loaded.fit(x[rank], y[rank], batch_size=BATCH, verbose=0)
    assert_same_on_every_rank(loaded.get_weights())


def test_loss_scale_optimizer_steps_together(rank, size):
    model = make_model(seed=50)
    inner = keras.optimizers.SGD(0.1)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(inner)),
                  loss=loss_fn(), jit_compile=False)
    x, y = rank_data(size)
    model.fit(x[rank], y[rank], batch_size=BATCH, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_same_on_every_rank(model.get_weights())


def test_distributed_optimizer_argument_errors():
    with pytest.raises(TypeError, match="wraps a Keras optimizer"):
        hvd.DistributedOptimizer(object())
    with pytest.raises(ValueError, match="backward_passes_per_step must be at least 1"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="op must be Average, Sum or Adasum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)
    with pytest.raises(ValueError, match="already accumulates over 3"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(gradient_accumulation_steps=3),
                                 backward_passes_per_step=2)
    with pytest.raises(TypeError, match="wraps a tf.GradientTape"):
        hvd.DistributedGradientTape(object())


def test_mixed_precision_reduces_before_the_loss_scaler(rank, size):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        model = make_model(seed=60)
        model.compile(optimizer=opt, loss=loss_fn(), jit_compile=False)
        assert model.optimizer is opt  # compile did not wrap it again
        x, y = rank_data(size)
        model.fit(x[rank], y[rank], batch_size=BATCH, verbose=0,
                  callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)])
        assert_same_on_every_rank(model.get_weights())
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_broadcast_callback_leaves_each_ranks_dropout_seed(rank, size):
    keras.utils.set_random_seed(70 + rank)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4),
                              keras.layers.Dropout(0.5), keras.layers.Dense(3)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss=loss_fn(),
                  jit_compile=False)
    x, y = rank_data(size, batches=1)
    model.fit(x[rank], y[rank], batch_size=BATCH, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)])
    assert_same_on_every_rank(model.get_weights())
    seeds = hvd.allgather_object([v.numpy().tolist() for v in model.variables
                                  if "seed_generator" in v.path])
    if size > 1:
        assert seeds[0] != seeds[1]  # dropout masks still differ between ranks


def test_metric_average_with_different_keys_raises_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    callback = hk.callbacks.MetricAverageCallback()
    with pytest.raises(ValueError, match=r"different metrics at epoch 3.*only_on_rank_"):
        callback.on_epoch_end(3, {"loss": 1.0, f"only_on_rank_{rank}": 2.0})
    logs = {"loss": float(rank)}
    callback.on_epoch_end(4, logs)  # still usable
    assert logs["loss"] == pytest.approx((size - 1) / 2)


def _gradients(model, x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn()(y, model(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def test_broadcast_callback_leaves_each_ranks_accumulated_gradients(rank, size):
    # backward_passes_per_step=2: the broadcast after the first batch sets
    # the weights and the optimizer's state, but each rank keeps the pass
    # it has accumulated (Horovod's aggregation buffers are no variables)
    lr = 0.1
    x, y = rank_data(size, batches=2)
    starts = [make_model(seed=50 + r) for r in range(size)]
    root = starts[0]
    total = [np.zeros(v.shape, np.float64) for v in root.trainable_variables]
    for r in range(size):
        # batch 0 at the rank's own weights, batch 1 at the root's
        for b, at in ((0, starts[r]), (1, root)):
            rows = slice(b * BATCH, (b + 1) * BATCH)
            for t, g in zip(total, _gradients(at, x[r][rows], y[r][rows])):
                t += g
    expected = [w.numpy() - lr * t / size for w, t in zip(root.trainable_variables, total)]
    model = make_model(seed=50 + rank)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(lr),
                                                     backward_passes_per_step=2),
                  loss=loss_fn(), jit_compile=False)
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0)])
    for got, want in zip(model.trainable_variables, expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_local_layers_sum_the_accumulated_passes_as_the_reduced_ones(rank, size):
    # Keras 3 averages accumulated passes; hora makes them a sum (Horovod's
    # default) for the local layers' gradients as for the reduced ones
    lr = 0.1
    x, y = rank_data(size, batches=2)
    model = make_model(seed=60)
    local = model.layers[-1]
    own = make_model(seed=60)
    passes = [_gradients(own, x[rank][b * BATCH:(b + 1) * BATCH],
                         y[rank][b * BATCH:(b + 1) * BATCH]) for b in range(2)]
    index = [i for i, v in enumerate(model.trainable_variables)
             if any(v is w for w in local.trainable_variables)]
    expected = {i: own.trainable_variables[i].numpy() - lr * (passes[0][i] + passes[1][i]) / size
                for i in index}
    model.compile(optimizer=hk.PartialDistributedOptimizer(
        keras.optimizers.SGD(lr), backward_passes_per_step=2, local_layers=[local]),
        loss=loss_fn(), jit_compile=False)
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    for i in index:
        np.testing.assert_allclose(model.trainable_variables[i].numpy(), expected[i],
                                   rtol=1e-5, atol=1e-6)


def test_mixed_float16_with_accumulation(rank, size):
    # hora wraps the optimizer in a LossScaleOptimizer under mixed_float16;
    # the accumulation goes to the optimizer inside it
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = make_model(seed=70)
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2)
        assert isinstance(opt, keras.optimizers.LossScaleOptimizer)
        assert opt.inner_optimizer.gradient_accumulation_steps == 2
        model.compile(optimizer=opt, loss=loss_fn(), jit_compile=False)
        x, y = rank_data(size, batches=4)
        model.fit(x[rank], y[rank], batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
                  callbacks=[hk.callbacks.BroadcastGlobalVariablesCallback(0,
                                                                           at_train_begin=True)])
        assert int(opt.inner_optimizer.iterations.numpy()) == 2
        assert_same_on_every_rank(model.get_weights())
    finally:
        keras.mixed_precision.set_global_policy(policy)


class _PerClass(keras.callbacks.Callback):
    def __init__(self, rank):
        super().__init__()
        self.rank = rank

    def on_epoch_end(self, epoch, logs=None):
        logs["per_class"] = np.array([self.rank, 2.0 * self.rank, 1.0], np.float32)


def test_metric_average_callback_averages_array_metrics(rank, size):
    model = make_model(seed=21)
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)),
                  loss=loss_fn(), jit_compile=False)
    x, y = rank_data(size, batches=1)
    averaged = Recorder()
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[_PerClass(rank), hk.callbacks.MetricAverageCallback(), averaged])
    mean = (size - 1) / 2
    value = averaged.epoch_logs[0]["per_class"]
    assert value.dtype == np.float32
    np.testing.assert_allclose(value, [mean, 2 * mean, 1.0], rtol=1e-6)


def test_the_tensorflow_spelling_takes_horovods_parameters_in_their_order(rank, size):
    # horovod.tensorflow.DistributedOptimizer(optimizer, name, use_locking,
    # device_dense, device_sparse, compression, sparse_as_dense,
    # backward_passes_per_step, op, ...)
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), "renamed", True, "", "",
                                   hvd.Compression.none, False, 2, hvd.Sum)
    assert isinstance(opt, _DistributedOptimizer) and opt.name == "renamed"
    assert opt.gradient_accumulation_steps == 2
    assert opt._hora_reducer.op == hvd.Sum
