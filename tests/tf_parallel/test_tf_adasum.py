"""op=Adasum in hora.tensorflow: allreduce eagerly and in tf.function, and
DistributedGradientTape / the Keras DistributedOptimizer combining
gradients with Adasum (Horovod's TensorFlow semantics), against a NumPy
reference of the Adasum tree; sizes that are not a power of two are refused."""

import zlib

import numpy as np
import pytest
import tensorflow as tf

from adasum_reference import tree
import hora.tensorflow as hvd




def vector(tag, rank, count=11):
    return np.random.default_rng([zlib.crc32(tag.encode()), rank]).normal(size=count)


@pytest.fixture
def power_of_two(size):
    if size & (size - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks")


def test_allreduce_adasum_eager_and_in_a_function(rank, size, mode, power_of_two):
    x = tf.constant(vector("tf.adasum", rank))
    got = mode(lambda t: hvd.allreduce(t, op=hvd.Adasum, name="tf.adasum"))(x)
    want = tree([vector("tf.adasum", r) for r in range(size)])
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_allreduce_adasum_refused_off_a_power_of_two(rank, size):
    if not size & (size - 1):
        pytest.skip("a power of two")
    with pytest.raises(ValueError, match=f"power of two, got {size} ranks"):
        hvd.allreduce(tf.constant(vector("tf.adasum.bad", rank)), op=hvd.Adasum)


def test_gradient_tape_combines_gradients_with_adasum(rank, size, power_of_two):
    w = tf.Variable(np.ones(11))
    x = tf.constant(vector("tf.tape", rank))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * w * x)
    tape = hvd.DistributedGradientTape(tape, op=hvd.Adasum)
    (grad,) = tape.gradient(loss, [w])
    want = tree([2 * vector("tf.tape", r) for r in range(size)])
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-12, atol=1e-12)


def test_keras_optimizer_with_adasum_keeps_ranks_identical(rank, size, power_of_two):
    keras = tf.keras
    tf.keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd.Adasum)
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    rng = np.random.default_rng(rank)
    model.fit(rng.normal(size=(16, 4)), rng.normal(size=(16, 2)), batch_size=8, verbose=0)
    weights = hvd.allgather_object([w.tobytes() for w in model.get_weights()])
    assert all(w == weights[0] for w in weights)
