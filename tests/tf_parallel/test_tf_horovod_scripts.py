"""The bodies of Horovod's TensorFlow 2 examples (tensorflow2_keras_mnist.py
and tensorflow2_mnist.py), with only the import changed and synthetic data
instead of the MNIST download: they train, and every rank ends with the same
weights (that the gradients are right is tested against single-process
training in test_tf_keras.py). The two Keras 3 changes any Horovod user
makes anyway are marked: compile() no longer takes
experimental_run_tf_function, and optimizer.variables is a property."""

import numpy as np
import tensorflow as tf

import hora.tensorflow as hvd_tf
import hora.tensorflow.keras as hvd


def synthetic_mnist(rank):
    rng = np.random.default_rng(rank)
    labels = rng.integers(0, 10, size=512)
    images = (rng.random((512, 28, 28)) * 0.3 + (labels[:, None, None] / 10.0)).astype(np.float32)
    return images, labels


def mnist_model():
    return tf.keras.Sequential([
        tf.keras.layers.Input((28, 28, 1)),
        tf.keras.layers.Conv2D(8, [3, 3], activation="relu"),
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ])


def same_on_every_rank(weights):
    for other in hvd.allgather_object([w.copy() for w in weights]):
        for a, b in zip(other, weights):
            np.testing.assert_array_equal(a, b)


def test_horovod_tensorflow2_keras_mnist_body(tmp_path):
    hvd.init()
    images, labels = synthetic_mnist(hvd.rank())
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., tf.newaxis], tf.float32), tf.cast(labels, tf.int64)))
    dataset = dataset.repeat().shuffle(10000).batch(32)
    model = mnist_model()
    scaled_lr = 0.001 * hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)
    opt = hvd.DistributedOptimizer(opt, backward_passes_per_step=1,
                                   average_aggregated_gradients=True)
    model.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                  metrics=["accuracy"])  # Keras 3: no experimental_run_tf_function
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=0),
    ]
    if hvd.rank() == 0:
        callbacks.append(
            tf.keras.callbacks.ModelCheckpoint(str(tmp_path / "checkpoint-{epoch}.keras")))
    verbose = 1 if hvd.rank() == 0 else 0
    start = hvd.broadcast_object(model.get_weights(), root_rank=0)  # what the callback sets
    model.fit(dataset, steps_per_epoch=12 // hvd.size(), callbacks=callbacks, epochs=2,
              verbose=verbose)
    same_on_every_rank(model.get_weights())
    assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), start))


def test_horovod_tensorflow2_mnist_body():
    hvd_tf.init()
    images, labels = synthetic_mnist(100 + hvd_tf.rank())
    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(images[..., tf.newaxis], tf.float32), tf.cast(labels, tf.int64)))
    dataset = dataset.repeat().shuffle(10000).batch(32)
    model = mnist_model()
    loss = tf.losses.SparseCategoricalCrossentropy()
    opt = tf.optimizers.Adam(0.001 * hvd_tf.size())

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss_value = loss(labels, probs)
        tape = hvd_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:
            hvd_tf.broadcast_variables(model.variables, root_rank=0)
            hvd_tf.broadcast_variables(opt.variables, root_rank=0)  # Keras 3: a property
        return loss_value

    start = hvd_tf.broadcast_object(model.get_weights(), root_rank=0)
    for batch, (images, labels) in enumerate(dataset.take(12)):
        training_step(images, labels, batch == 0)
    same_on_every_rank(model.get_weights())
    assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), start))
