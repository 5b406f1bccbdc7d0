"""Behaviour Horovod defines for TensorFlow that hora matches: TF1-style
graphs run by a Session with many collectives in one run, gradient
collectives named uniquely, alltoall's return value and errors, IndexedSlices
with integer values, uint16, and the tf.errors classes."""

import numpy as np
import pytest

from conftest import hvd, tf

# A regression that hangs is ended by the stall shutdown the suite sets
# (tests/test_tensorflow_suite.py) rather than waiting for the job timeout.
RUN_OPTIONS = tf.compat.v1.RunOptions(timeout_in_ms=60000)
SESSION_DTYPES = [tf.uint8, tf.int8, tf.int32, tf.int64, tf.float16, tf.float32, tf.float64]


def session_run(graph, fetches):
    # two inter-op threads: far fewer than the collectives in flight
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    with tf.compat.v1.Session(graph=graph, config=config) as session:
        return session.run(fetches, options=RUN_OPTIONS)


def test_session_runs_many_collectives_at_once(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        inputs, outputs = [], []
        for dtype in SESSION_DTYPES:
            for dims in (1, 2, 3):
                x = tf.cast(tf.fill([3] * dims, rank + 1), dtype)
                inputs.append(x)
                outputs.append(hvd.allreduce(x, op=hvd.Sum))
    results = session_run(graph, outputs)
    total = sum(r + 1 for r in range(size))
    assert len(results) == 21
    for result, dtype in zip(results, [d for d in SESSION_DTYPES for _ in range(3)]):
        assert result.dtype == dtype.as_numpy_dtype
        np.testing.assert_array_equal(result, np.full(result.shape, total))


def test_session_gradients_of_allgather_broadcast_and_sparse(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full((2, 3), rank + 1.0, np.float32))
        gathered = hvd.allgather(x)
        broadcast = hvd.broadcast(x, 0)
        gather_grad, = tf.gradients(tf.reduce_sum(gathered * 2.0), [x])
        bcast_grad, = tf.gradients(tf.reduce_sum(broadcast * 3.0), [x])
        slices = tf.IndexedSlices(x, tf.constant([0, 1], tf.int64), tf.constant([2, 3], tf.int64))
        sparse, dense = hvd.grouped_allreduce([slices, x], op=hvd.Average)
        fetches = [gathered, gather_grad, bcast_grad, sparse.values, sparse.indices, dense]
    g, gg, bg, values, indices, dense = session_run(graph, fetches)
    assert g.shape == (2 * size, 3)
    np.testing.assert_allclose(gg, np.full((2, 3), 2.0))  # the average of 2.0 over ranks
    np.testing.assert_allclose(bg, np.full((2, 3), 3.0 if rank == 0 else 0.0))
    assert values.shape == (2 * size, 3) and indices.tolist() == [0, 1] * size
    np.testing.assert_allclose(dense, np.full((2, 3), sum(r + 1 for r in range(size)) / size))


def test_grouped_gradients_twice_in_one_graph(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant(np.full((size, 2), rank + 1.0, np.float32))
        gathered = hvd.grouped_allgather([x, x * 2.0])
        scattered = hvd.grouped_reducescatter([x, x * 2.0], op=hvd.Sum)
        # two backward passes through each collective, run together
        grads = (tf.gradients(tf.reduce_sum(gathered[0]) + tf.reduce_sum(gathered[1]), [x])
                 + tf.gradients(tf.reduce_sum(gathered[1]), [x])
                 + tf.gradients(tf.reduce_sum(scattered[0]), [x])
                 + tf.gradients(tf.reduce_sum(scattered[1]), [x]))
    g1, g2, s1, s2 = session_run(graph, grads)
    np.testing.assert_allclose(g1, np.full((size, 2), 3.0))
    np.testing.assert_allclose(g2, np.full((size, 2), 2.0))
    np.testing.assert_allclose(s1, np.full((size, 2), float(size)))
    np.testing.assert_allclose(s2, np.full((size, 2), 2.0 * size))


def test_alltoall_splits_dtype_and_uneven_rows(rank, size):
    output, received = hvd.alltoall(tf.ones([size, 2]), splits=[1] * size)
    assert received.dtype == tf.int32 and output.shape == (size, 2)
    if size == 1:
        return
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="splits not provided, but first dimension of tensor is not an even "
                             "multiple of the number of workers"):
        hvd.alltoall(tf.ones([size + 1, 2]), name="tf.semantics.uneven")


def test_indexed_slices_with_integer_values_average_to_float64(rank, size):
    slices = tf.IndexedSlices(tf.constant([[rank + 1, 3]], tf.int32), tf.constant([0], tf.int64),
                              tf.constant([1, 2], tf.int64))
    result = hvd.allreduce(slices, op=hvd.Average)
    assert result.values.dtype == tf.float64
    np.testing.assert_allclose(result.values.numpy(),
                               [[(r + 1) / size, 3 / size] for r in range(size)])


def test_uint16(rank, size, mode):
    x = tf.constant([rank, 65535], tf.uint16)
    gathered = mode(lambda t: hvd.allgather(t))(x)
    assert gathered.dtype == tf.uint16
    assert gathered.numpy().tolist() == [v for r in range(size) for v in (r, 65535)]
    maximum = mode(lambda t: hvd.allreduce(t, op=hvd.Max))(x)
    assert maximum.numpy().tolist() == [size - 1, 65535]


# --- Keras and TF names Horovod code uses --------------------------------------

def small_model(seed):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="shared"),
                             keras.layers.Dense(1, name="local")])


def test_broadcast_callback_keeps_local_variables(rank, size):
    import keras

    import hora.keras as hk

    model = small_model(seed=5 + rank)
    local = model.get_layer("local").kernel
    mine = local.numpy().copy()
    model.compile(optimizer=hk.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse",
                  jit_compile=False)
    x = np.ones((4, 3), np.float32)
    model.fit(x, np.zeros((4, 1)), batch_size=2, verbose=0, callbacks=[
        hk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[local])])
    shared = hvd.allgather_object(model.get_layer("shared").kernel.numpy().tolist())
    assert all(s == shared[0] for s in shared)
    np.testing.assert_array_equal(local.numpy(), mine)  # lr 0: untouched, not broadcast


def test_partial_distributed_optimizer_keeps_local_gradients(rank, size):
    import keras

    import hora.keras as hk

    model = small_model(seed=9)
    opt = hk.PartialDistributedOptimizer(keras.optimizers.SGD(1.0),
                                         local_layers=model.get_layer("local"))
    model.compile(optimizer=opt, loss="mse", jit_compile=False)
    start = [w.numpy().copy() for w in model.trainable_weights]
    x = np.full((2, 3), rank + 1.0, np.float32)
    y = np.zeros((2, 1), np.float32)
    model.train_on_batch(x, y)
    # the single-rank gradients, to compare against
    reference = small_model(seed=9)
    grads = []
    for r in range(size):
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(y, reference(np.full((2, 3), r + 1.0)))
        grads.append([g.numpy() for g in tape.gradient(loss, reference.trainable_weights)])
    local = {id(w) for w in model.get_layer("local").trainable_weights}
    for k, (weight, before) in enumerate(zip(model.trainable_weights, start)):
        step = before - weight.numpy()
        if id(weight) in local:  # this rank's gradient, divided by size
            np.testing.assert_allclose(step, grads[rank][k] / size, rtol=1e-4, atol=1e-6)
        else:
            np.testing.assert_allclose(step, np.mean([g[k] for g in grads], axis=0), rtol=1e-4,
                                       atol=1e-6)


def test_partial_distributed_gradient_tape(rank, size):
    model = small_model(seed=13)
    x = np.full((2, 3), rank + 1.0, np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[model.get_layer("local")],
                                              scale_local_gradients=False)
    grads = tape.gradient(loss, model.trainable_weights)
    local_kernel = grads[2].numpy()
    gathered = hvd.allgather_object(local_kernel.tolist())
    if size > 1:
        assert gathered[0] != gathered[1]  # not reduced, not scaled
    shared = hvd.allgather_object(grads[0].numpy().tolist())
    assert all(s == shared[0] for s in shared)
    with pytest.raises(ValueError, match="must be of tf.keras.layers.Layer type"):
        hvd.PartialDistributedGradientTape(tf.GradientTape(), local_layers=[object()])


def test_keras_collectives_take_horovods_arguments(rank, size):
    import hora.keras as hk

    total = hk.allreduce([float(rank), 1.0], "keras.semantics.sum", op=hk.Sum)
    np.testing.assert_allclose(total.numpy(), [sum(range(size)), size])
    assert hk.allgather([rank], "keras.semantics.gather").numpy().tolist() == list(range(size))
    assert hk.broadcast([rank + 5], 0, "keras.semantics.bcast").numpy().tolist() == [5]
    rows = hk.reducescatter(np.ones((size, 2), np.float32), "keras.semantics.rs", op=hk.Sum)
    np.testing.assert_allclose(rows.numpy(), np.full((1, 2), size))
    for name in ("gloo_built", "gloo_enabled", "cuda_built", "rocm_built", "ddl_built",
                 "ccl_built"):
        assert getattr(hk, name)() in (True, False)
    with pytest.raises(RuntimeError, match="does not support eager execution"):
        hk.broadcast_global_variables(0)


def test_tf1_session_hook_and_helpers(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        variable = tf.compat.v1.get_variable("v", initializer=tf.constant([float(rank)] * 2))
        hook = hvd.BroadcastGlobalVariablesHook(0)
        with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as session:
            value = session.run(variable)
    assert value.tolist() == [0.0, 0.0]
    assert hvd.broadcast_object_fn(root_rank=0)({"rank": rank}) == {"rank": 0}
    assert hvd.check_num_rank_power_of_2(4) and not hvd.check_num_rank_power_of_2(6)
    assert hvd.handle_average_backwards_compatibility(None, None) == hvd.Average


def test_learning_rate_schedule_constant_multiplier_decays(rank, size):
    import keras

    import hora.keras as hk

    model = small_model(seed=21)
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse", jit_compile=False)
    schedule = hk.callbacks.LearningRateScheduleCallback(0.8, multiplier=0.5, start_epoch=1)
    x, y = np.ones((2, 3), np.float32), np.zeros((2, 1), np.float32)
    history = model.fit(x, y, epochs=4, verbose=0, callbacks=[schedule])
    # Horovod: multiplier ** (epoch - start_epoch) from start_epoch on, logged as "lr"
    np.testing.assert_allclose(history.history["lr"], [1.0, 0.8, 0.4, 0.2])


# --- DistributedGradientTape's Horovod API ----------------------------------

def test_tape_local_and_global_gradients_and_generic_names(rank, size):
    shared = tf.Variable([1.0, 2.0])
    own = tf.Variable([3.0])
    with tf.GradientTape() as plain:
        loss = tf.reduce_sum(shared * (rank + 1.0)) + tf.reduce_sum(own * (rank + 1.0))
    tape = hvd.DistributedGradientTape(plain)
    tape.register_local_source(own)
    local, reduced = tape.get_local_and_global_gradients(loss, [shared, own],
                                                         use_generic_names=True)
    mean = sum(r + 1.0 for r in range(size)) / size
    assert [s is own for s, _ in local] == [True] and [s is shared for s, _ in reduced] == [True]
    np.testing.assert_allclose(reduced[0][1].numpy(), [mean, mean])
    np.testing.assert_allclose(local[0][1].numpy(), [(rank + 1.0) / size])
    # a tuple of sources gives a list, as Horovod's; use_generic_names is the
    # fourth positional argument there too
    with tf.GradientTape() as plain:
        loss = tf.reduce_sum(shared * (rank + 1.0))
    grads = hvd.DistributedGradientTape(plain).gradient(loss, (shared,), None, True)
    assert isinstance(grads, list)
    np.testing.assert_allclose(grads[0].numpy(), [mean, mean])


def test_grouped_allreduce_takes_ignore_name_scope_and_groups_zero_is_refused(rank, size):
    result = hvd.grouped_allreduce([tf.constant([rank + 1.0])], op=hvd.Sum,
                                   ignore_name_scope=True)
    assert result[0].numpy().tolist() == [sum(range(1, size + 1))]
    with tf.GradientTape() as plain:
        pass
    with pytest.raises(ValueError, match="groups should be a non-negative integer"):
        hvd.DistributedGradientTape(plain, groups=0)
    from hora.tensorflow import mpi_ops
    assert mpi_ops.init is hvd.init and mpi_ops.Max == hvd.Max
    assert mpi_ops.handle_average_backwards_compatibility(None, None) == hvd.Average
