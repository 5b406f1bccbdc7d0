"""What the Keras tests share, for either Keras (the module is passed in):
the small model, every rank's data, the single-process view of it, and the
check that all ranks hold the same values."""

import numpy as np

import hora.tensorflow as hvd

BATCH = 4
STEPS = 3


def make_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def rank_data(size, batches=STEPS, batch=BATCH):
    """Every rank's (x, y): rank r's batch i is rows [i*batch, (i+1)*batch) of its block."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(size, batches * batch, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=(size, batches * batch))
    return x, y


def global_batches(x, y, batch):
    """The single-process data: global batch i is every rank's batch i, concatenated."""
    size, rows = x.shape[0], x.shape[1]
    order = [(r, i) for i in range(rows // batch) for r in range(size)]
    gx = np.concatenate([x[r, i * batch:(i + 1) * batch] for r, i in order])
    gy = np.concatenate([y[r, i * batch:(i + 1) * batch] for r, i in order])
    return gx, gy


def assert_same_on_every_rank(arrays):
    mine = [np.array(a, copy=True) for a in arrays]
    for other in hvd.allgather_object(mine):
        for a, b in zip(other, mine):
            np.testing.assert_array_equal(a, b)
