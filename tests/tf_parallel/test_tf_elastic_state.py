"""TensorFlow and Keras elastic states as Horovod's: TensorFlowState
without variables (global variables: none eagerly), a tf.Module model, a TF1
optimizer, KerasState.backend, and CommitStateCallback's commit() hook.
Without an elastic horarun, save, restore and sync are called directly
(sync is collective)."""

import numpy as np

from conftest import hvd, tf


def test_tensorflow_state_of_keywords_alone(rank, size):
    state = hvd.elastic.TensorFlowState(epoch=rank, batch=2)
    assert state.variables == []
    state.sync()
    assert (state.epoch, state.batch) == (0, 2)
    state.epoch = 5
    state.commit()
    state.epoch = 6
    state.restore()
    assert state.epoch == 5


class Linear(tf.Module):
    def __init__(self, value):
        super().__init__()
        self.w = tf.Variable([value, value])


def test_a_tf_module_with_a_tf1_optimizer(rank, size):
    model = Linear(float(rank + 1))
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5))
    state = hvd.elastic.TensorFlowKerasState(model, optimizer=optimizer, step=0)
    state.sync()  # rank 0's weights everywhere
    np.testing.assert_array_equal(model.w.numpy(), [1.0, 1.0])
    optimizer.minimize(lambda: tf.reduce_sum(model.w * (rank + 1.0)), var_list=[model.w])
    mean = sum(r + 1.0 for r in range(size)) / size
    np.testing.assert_allclose(model.w.numpy(), [1.0 - 0.5 * mean] * 2)
    state.commit()
    model.w.assign([9.0, 9.0])
    state.restore()
    np.testing.assert_allclose(model.w.numpy(), [1.0 - 0.5 * mean] * 2)


def test_keras_state_backend_and_the_commit_hook(rank, size):
    import keras

    import hora.tensorflow.keras as hvd_keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss="mse")
    state = hvd_keras.elastic.KerasState(model, epoch=0, batch=0)
    assert state.backend is keras.backend
    commits = []

    class Counting(hvd_keras.elastic.CommitStateCallback):
        def commit(self):
            commits.append(self.state.batch)
            super().commit()

    callbacks = [hvd_keras.elastic.UpdateEpochStateCallback(state),
                 hvd_keras.elastic.UpdateBatchStateCallback(state),
                 Counting(state, batches_per_commit=2)]
    assert all(c.backend is keras.backend for c in callbacks)
    x = np.ones((8, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=2, epochs=1, callbacks=callbacks, verbose=0)
    # after batches 1 and 3 (every second batch), then at the epoch's end
    assert commits == [1, 3, 0] and state.epoch == 1
