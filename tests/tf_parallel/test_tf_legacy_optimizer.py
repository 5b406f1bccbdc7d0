"""hvd.DistributedOptimizer wrapping TensorFlow 1's optimizers
(tf.compat.v1.train.Optimizer), as Horovod's TF1 scripts use it: in graphs
run by a Session (also a MonitoredTrainingSession with Horovod's hooks) and
eagerly, with accumulation, local variables, sparse gradients and the
errors Horovod gives. Expected values come from NumPy on every rank."""

import numpy as np
import pytest

from conftest import hvd, tf

RUN_OPTIONS = tf.compat.v1.RunOptions(timeout_in_ms=60000)


def session(graph):
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    return tf.compat.v1.Session(graph=graph, config=config)


def rank_inputs(rank, rows=4):
    """A linear model's inputs, different on every rank."""
    rng = np.random.default_rng(100 + rank)
    return rng.normal(size=(rows, 3)).astype(np.float32)


def mean_gradient(w, size):
    """The ranks' average gradient of sum((x @ w) ** 2) / 2 at w."""
    grads = []
    for r in range(size):
        x = rank_inputs(r)
        grads.append(x.T @ (x @ w))
    return np.mean(grads, axis=0)


def linear_graph(rank, make_optimizer, steps_kwargs=None):
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable(np.ones((3, 1), np.float32), name="w")
        x = tf.constant(rank_inputs(rank))
        loss = tf.reduce_sum(tf.square(tf.matmul(x, w))) / 2.0
        optimizer = make_optimizer()
        step = tf.compat.v1.train.get_or_create_global_step()
        train = optimizer.minimize(loss, global_step=step, **(steps_kwargs or {}))
        init = [tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.local_variables_initializer()]
    return graph, w, step, train, init, optimizer


def test_gradient_descent_in_a_session_averages_the_gradients(rank, size):
    graph, w, step, train, init, optimizer = linear_graph(rank, lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.05)))
    assert isinstance(optimizer, tf.compat.v1.train.Optimizer)
    assert optimizer.get_name() == "DistributedGradientDescentOptimizer"
    expected = np.ones((3, 1), np.float32)
    with session(graph) as s:
        s.run(init)
        for _ in range(3):
            s.run(train, options=RUN_OPTIONS)
            expected = expected - 0.05 * mean_gradient(expected, size)
            np.testing.assert_allclose(s.run(w), expected, rtol=1e-5)
        assert s.run(step) == 3


def test_adam_slots_and_variables_are_the_wrapped_optimizers(rank, size):
    graph, w, _, train, init, optimizer = linear_graph(rank, lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.AdamOptimizer(0.1), name="mine"))
    assert optimizer.get_name() == "mine"
    with graph.as_default():
        assert optimizer.get_slot_names() == ["m", "v"]
        assert optimizer.get_slot(graph.get_collection("trainable_variables")[0], "m") is not None
        names = sorted(v.op.name for v in optimizer.variables())
        assert names == ["beta1_power", "beta2_power", "w/Adam", "w/Adam_1"]
    with session(graph) as s:
        s.run(init)
        s.run(train, options=RUN_OPTIONS)
        # Adam's first step moves each weight by the learning rate against
        # the sign of the averaged gradient
        g = mean_gradient(np.ones((3, 1), np.float32), size)
        np.testing.assert_allclose(s.run(w), 1.0 - 0.1 * np.sign(g), rtol=1e-4)


@pytest.mark.parametrize("average", [False, True])
def test_backward_passes_sum_and_apply_every_nth_run(rank, size, average):
    passes = 3
    graph, w, step, train, init, _ = linear_graph(rank, lambda: hvd.DistributedOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(0.02), backward_passes_per_step=passes,
        average_aggregated_gradients=average))
    expected = np.ones((3, 1), np.float32)
    with session(graph) as s:
        s.run(init)
        for run in range(1, 2 * passes + 1):
            s.run(train, options=RUN_OPTIONS)
            if run % passes == 0:
                # the weights did not move during the passes: the same gradient each time
                total = passes * mean_gradient(expected, size)
                expected = expected - 0.02 * (total / passes if average else total)
            np.testing.assert_allclose(s.run(w), expected, rtol=1e-5)
            # global_step counts every run, applied or not, as in Horovod
            assert s.run(step) == run


def test_monitored_training_session_with_horovods_hooks(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        # a different start on every rank; the hook broadcasts rank 0's
        w = tf.compat.v1.Variable(np.full((3, 1), rank + 1.0, np.float32), name="w")
        x = tf.constant(rank_inputs(rank))
        loss = tf.reduce_sum(tf.square(tf.matmul(x, w))) / 2.0
        optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(0.01, 0.9),
                                             backward_passes_per_step=2)
        step = tf.compat.v1.train.get_or_create_global_step()
        train = optimizer.minimize(loss, global_step=step)
        # the accumulators are local variables: the session's scaffold initializes them
        hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as s:
            for _ in range(6):
                s.run(train, options=RUN_OPTIONS)
            final, steps = s.run([w, step])
    assert steps == 6
    expected, velocity = np.ones((3, 1), np.float32), np.zeros((3, 1), np.float32)
    for _ in range(3):
        velocity = 0.9 * velocity + 2 * mean_gradient(expected, size)
        expected = expected - 0.01 * velocity
    np.testing.assert_allclose(final, expected, rtol=1e-4)
    gathered = hvd.allgather(tf.constant(final.reshape(1, 3))).numpy()
    np.testing.assert_array_equal(gathered, np.repeat(gathered[:1], size, axis=0))


def test_local_variables_and_sparse_gradients(rank, size):
    graph = tf.Graph()
    with graph.as_default():
        shared = tf.compat.v1.Variable(np.zeros(2, np.float32), name="shared")
        own = tf.compat.v1.Variable(np.zeros(2, np.float32), name="own")
        table = tf.compat.v1.Variable(np.zeros((size + 1, 2), np.float32), name="table")
        rows = tf.nn.embedding_lookup(table, tf.constant([rank]))  # an IndexedSlices gradient
        loss = (tf.reduce_sum(shared * (rank + 1.0)) + tf.reduce_sum(own * (rank + 1.0))
                + tf.reduce_sum(rows) * (rank + 1.0))
        optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0))
        optimizer.register_local_var(own)
        pairs = optimizer.compute_gradients(loss)
        train = optimizer.apply_gradients(pairs)
        init = tf.compat.v1.global_variables_initializer()
    assert isinstance(pairs[2][0], tf.IndexedSlices)
    with session(graph) as s:
        s.run(init)
        s.run(train, options=RUN_OPTIONS)
        shared_v, own_v, table_v = s.run([shared, own, table])
    mean = sum(r + 1.0 for r in range(size)) / size
    np.testing.assert_allclose(shared_v, [-mean, -mean])
    # a local gradient stays this rank's, divided by the number of ranks (Horovod's scaling)
    np.testing.assert_allclose(own_v, np.full(2, -(rank + 1.0) / size))
    expected_table = np.zeros((size + 1, 2), np.float32)
    for r in range(size):
        expected_table[r] -= (r + 1.0) / size
    np.testing.assert_allclose(table_v, expected_table)


def test_eager_minimize(rank, size):
    w = tf.Variable(np.ones((3, 1), np.float32))
    x = tf.constant(rank_inputs(rank))
    optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.05))
    optimizer.minimize(lambda: tf.reduce_sum(tf.square(tf.matmul(x, w))) / 2.0, var_list=[w])
    expected = 1.0 - 0.05 * mean_gradient(np.ones((3, 1), np.float32), size)
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5)


def test_errors_horovod_gives():
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with pytest.raises(ValueError, match="not yet supported for _LegacyOptimizer with eager"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=2)
    with pytest.raises(ValueError, match="Adasum does not support average_aggregated_gradients"):
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum, average_aggregated_gradients=True)
    with pytest.raises(ValueError, match="backward_passes_per_step must be at least 1"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(NotImplementedError, match="PyTorch-only"):
        hvd.DistributedOptimizer(sgd, sharding="optimizer_state")
    graph = tf.Graph()
    with graph.as_default():
        table = tf.compat.v1.Variable(np.zeros((3, 2), np.float32))
        loss = tf.reduce_sum(tf.nn.embedding_lookup(table, tf.constant([1])))
        optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                             backward_passes_per_step=2)
        with pytest.raises(ValueError, match="IndexedSlices are not supported when"):
            optimizer.compute_gradients(loss)
