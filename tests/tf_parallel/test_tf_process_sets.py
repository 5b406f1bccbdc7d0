"""Process sets through hora.tensorflow and its Keras face: every collective
with ``process_set=`` (eagerly and inside tf.function) against references
computed over the set's members' inputs, their gradients restricted to the
set, broadcasts from a global root inside the set, objects, barriers,
DistributedGradientTape and the Keras DistributedOptimizer training like one
process on the set's global batch, two sets using the same tensor name side
by side, and the errors of a process outside the set.

The sets are the even and the odd ranks (no odds on one rank, where the
evens are the global set), added on every rank in the same order; each
rank works in the set it belongs to.
The Keras test also runs under Keras 2 (TF_USE_LEGACY_KERAS=1), from
tests/test_tensorflow_suite.py."""

import keras_helpers
import numpy as np
import pytest
import tensorflow as tf
from conftest import rank_values
from keras_helpers import BATCH, global_batches, rank_data
from parity_sets import ParitySets

import hora
import hora.keras
import hora.tensorflow as hvd
import hora.tensorflow.keras as hk
from hora.tensorflow.keras import _flavor

keras = tf.keras


@pytest.fixture(scope="module")
def sets():
    made = ParitySets()
    yield made
    made.remove()


def members_values(tag, ps, shape, dtype=np.float32):
    return {r: rank_values(tag, r, shape, dtype) for r in ps.ranks}


def test_process_set_names_are_exported():
    for module in (hvd, hk, hora.keras):
        assert module.ProcessSet is hora.ProcessSet
        assert module.global_process_set is hora.global_process_set
        assert module.add_process_set is hora.add_process_set
        assert module.remove_process_set is hora.remove_process_set
    assert hvd.global_process_set.process_set_id == 0


def test_size_and_included_ops(sets, mode):
    mine, other = sets.mine, sets.other

    def ops():
        values = [hvd.size_op(), hvd.size_op(process_set_id=mine.process_set_id),
                  hvd.process_set_included_op(mine.process_set_id),
                  hvd.process_set_included_op(), hvd.size_op(process_set_id=12345),
                  hvd.process_set_included_op(12345)]
        if other is not None:
            values.append(hvd.process_set_included_op(other.process_set_id))
        return values
    got = [int(v) for v in mode(ops)()]
    assert got[:6] == [hvd.size(), len(mine.ranks), 1, 1, -3, -3]
    if other is not None:
        assert got[6] == 0


@pytest.mark.parametrize("dtype", [tf.float32, tf.int32])
def test_allreduce_sum_and_average(sets, mode, dtype):
    mine = sets.mine
    inputs = members_values("tf.ps.allreduce", mine, (4, 3), dtype.as_numpy_dtype)
    total = sum(v.astype(np.float64) for v in inputs.values())
    x = tf.constant(inputs[hvd.rank()])

    def reduce(x):
        named = hvd.allreduce(x, op=hvd.Sum, name="tf.ps.allreduce.sum", process_set=mine)
        unnamed = hvd.allreduce(x, op=hvd.Sum, process_set=mine)
        average = hvd.allreduce(tf.cast(x, tf.float32), process_set=mine)
        return named, unnamed, average
    named, unnamed, average = mode(reduce)(x)
    np.testing.assert_array_equal(named.numpy(), total.astype(dtype.as_numpy_dtype))
    np.testing.assert_array_equal(unnamed.numpy(), total.astype(dtype.as_numpy_dtype))
    # Average divides by the set's size, not the world's
    np.testing.assert_allclose(average.numpy(), total / len(mine.ranks), rtol=1e-6)


def test_allreduce_gradient_stays_in_the_set(sets, mode):
    mine = sets.mine
    weights = members_values("tf.ps.allreduce.w", mine, (3,))
    x = tf.constant(rank_values("tf.ps.allreduce.x", hvd.rank(), (3,)))
    w = tf.constant(weights[hvd.rank()])

    def grad(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(hvd.allreduce(x, op=hvd.Average, process_set=mine) * w)
        return tape.gradient(loss, x)
    got = mode(grad)(x, w)
    want = sum(weights.values()) / len(mine.ranks)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_grouped_allreduce(sets, mode):
    mine = sets.mine
    shapes = [(2,), (3, 2), (1,)]
    inputs = [members_values(f"tf.ps.grouped.{k}", mine, shape)
              for k, shape in enumerate(shapes)]
    xs = [tf.constant(values[hvd.rank()]) for values in inputs]

    def reduce(*xs):
        return hvd.grouped_allreduce(list(xs), op=hvd.Sum, process_set=mine)
    got = mode(reduce)(*xs)
    for result, values in zip(got, inputs):
        np.testing.assert_array_equal(result.numpy(), sum(values.values()))


def test_sparse_allreduce_gathers_the_sets_rows(sets):
    mine, rank = sets.mine, hvd.rank()
    slices = tf.IndexedSlices(tf.fill([1, 2], float(rank)), tf.constant([rank]),
                              dense_shape=tf.constant([hvd.size(), 2]))
    got = hvd.allreduce(slices, op=hvd.Average, process_set=mine)
    np.testing.assert_array_equal(got.indices.numpy(), mine.ranks)
    np.testing.assert_allclose(got.values.numpy(),
                               [[r / len(mine.ranks)] * 2 for r in mine.ranks])


def test_allgather_and_its_gradient(sets, mode):
    mine, rank = sets.mine, hvd.rank()
    n, me = len(mine.ranks), mine.rank()
    inputs = {r: rank_values("tf.ps.allgather", r, (k + 1, 2)) for k, r in enumerate(mine.ranks)}
    rows = n * (n + 1) // 2
    upstream = members_values("tf.ps.allgather.w", mine, (rows, 2))

    def gather(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            gathered = hvd.allgather(x, process_set=mine)
            loss = tf.reduce_sum(gathered * w)
        return gathered, tape.gradient(loss, x)
    gathered, grad = mode(gather)(tf.constant(inputs[rank]), tf.constant(upstream[rank]))
    np.testing.assert_array_equal(gathered.numpy(),
                                  np.concatenate([inputs[r] for r in mine.ranks]))
    # Horovod's gradient: this rank's rows of the set's average gradient
    start = me * (me + 1) // 2
    want = (sum(upstream.values()) / n)[start:start + me + 1]
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6)


def test_grouped_allgather(sets, mode):
    mine, rank = sets.mine, hvd.rank()
    a = members_values("tf.ps.gag.a", mine, (2, 2))
    b = members_values("tf.ps.gag.b", mine, (1,), np.int32)
    got = mode(lambda x, y: hvd.grouped_allgather([x, y], process_set=mine))(
        tf.constant(a[rank]), tf.constant(b[rank]))
    np.testing.assert_array_equal(got[0].numpy(), np.concatenate([a[r] for r in mine.ranks]))
    np.testing.assert_array_equal(got[1].numpy(), np.concatenate([b[r] for r in mine.ranks]))


def test_broadcast_from_a_global_root_in_the_set(sets, mode):
    mine, rank = sets.mine, hvd.rank()
    root = mine.ranks[-1]  # a global rank
    upstream = members_values("tf.ps.bcast.w", mine, (3,))

    def cast(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = hvd.broadcast(x, root_rank=root, process_set=mine)
            loss = tf.reduce_sum(y * w)
        return y, tape.gradient(loss, x)
    y, grad = mode(cast)(tf.constant(rank_values("tf.ps.bcast", rank, (3,))),
                         tf.constant(upstream[rank]))
    np.testing.assert_array_equal(y.numpy(), rank_values("tf.ps.bcast", root, (3,)))
    # the root gets the set's average gradient, the others zero
    want = sum(upstream.values()) / len(mine.ranks) if rank == root else np.zeros(3)
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6)


def test_broadcast_variables_and_broadcast_(sets, mode):
    mine, rank = sets.mine, hvd.rank()
    root = mine.ranks[0]
    a = tf.Variable(rank_values("tf.ps.bv.a", rank, (3,)))
    b = tf.Variable(rank_values("tf.ps.bv.b", rank, (2, 2), np.int32))

    def cast():
        hvd.broadcast_variables([a, b], root_rank=root, process_set=mine)
    mode(cast)()
    np.testing.assert_array_equal(a.numpy(), rank_values("tf.ps.bv.a", root, (3,)))
    np.testing.assert_array_equal(b.numpy(), rank_values("tf.ps.bv.b", root, (2, 2), np.int32))
    c = tf.Variable(tf.fill([2], float(rank)))
    last = mine.ranks[-1]

    def cast_():
        hvd.broadcast_([c], last, name="tf.ps.broadcast_", process_set=mine)
    mode(cast_)()
    np.testing.assert_array_equal(c.numpy(), [float(last)] * 2)


def test_alltoall_and_its_gradient(sets, mode):
    mine, rank = sets.mine, hvd.rank()
    n, me = len(mine.ranks), mine.rank()
    send = np.arange(2 * n, dtype=np.float32).reshape(2 * n, 1) + 100 * rank

    def exchange(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            received, splits = hvd.alltoall(x, splits=[2] * n, process_set=mine)
            even = hvd.alltoall(x, process_set=mine)
            loss = tf.reduce_sum(received) * 2.0 + tf.reduce_sum(even)
        return received, splits, even, tape.gradient(loss, x)
    received, splits, even, grad = mode(exchange)(tf.constant(send))
    want = np.concatenate([np.arange(2 * me, 2 * me + 2, dtype=np.float32).reshape(2, 1)
                           + 100 * r for r in mine.ranks])
    # received splits: one entry per member of the set
    assert splits.numpy().tolist() == [2] * n
    np.testing.assert_array_equal(received.numpy(), want)
    np.testing.assert_array_equal(even.numpy(), want)
    np.testing.assert_array_equal(grad.numpy(), np.full((2 * n, 1), 3.0))


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_reducescatter_and_its_gradient(sets, mode, op):
    mine, rank = sets.mine, hvd.rank()
    n, me = len(mine.ranks), mine.rank()
    inputs = members_values("tf.ps.rs", mine, (2 * n, 3))
    upstream = members_values("tf.ps.rs.w", mine, (2, 3))
    reduce_op = getattr(hvd, op)

    def scatter(x, w):
        with tf.GradientTape() as tape:
            tape.watch(x)
            block = hvd.reducescatter(x, op=reduce_op, process_set=mine)
            loss = tf.reduce_sum(block * w)
        return block, tape.gradient(loss, x)
    block, grad = mode(scatter)(tf.constant(inputs[rank]), tf.constant(upstream[rank]))
    total = sum(inputs.values()) / (n if op == "Average" else 1)
    np.testing.assert_allclose(block.numpy(), total[2 * me:2 * me + 2], rtol=1e-6)
    # Horovod's gradient: the set's gathered gradient, times its size for Sum
    want = np.concatenate([upstream[r] for r in mine.ranks]) * (n if op == "Sum" else 1)
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-6)


def test_grouped_reducescatter(sets, mode):
    mine, rank = sets.mine, hvd.rank()
    n, me = len(mine.ranks), mine.rank()
    a = members_values("tf.ps.grs.a", mine, (n, 2))
    b = members_values("tf.ps.grs.b", mine, (2 * n,))
    got = mode(lambda x, y: hvd.grouped_reducescatter([x, y], op=hvd.Sum, process_set=mine))(
        tf.constant(a[rank]), tf.constant(b[rank]))
    np.testing.assert_array_equal(got[0].numpy(), sum(a.values())[me:me + 1])
    np.testing.assert_array_equal(got[1].numpy(), sum(b.values())[2 * me:2 * me + 2])


def test_barrier(sets, mode):
    assert int(mode(lambda: hvd.barrier(process_set=sets.mine))()) == 0
    assert int(hvd.barrier()) == 0


def test_broadcast_and_allgather_objects(sets):
    mine, rank = sets.mine, hvd.rank()
    root = mine.ranks[-1]
    assert hvd.broadcast_object({"from": rank}, root_rank=root, process_set=mine) == {
        "from": root}
    assert hvd.allgather_object(("r", rank), process_set=mine) == [("r", r) for r in mine.ranks]
    fn = hvd.broadcast_object_fn(root_rank=mine.ranks[0], process_set=mine)
    assert fn([rank]) == [mine.ranks[0]]
    assert hk.allgather_object(rank, process_set=mine) == mine.ranks
    assert hk.broadcast_object(rank, root_rank=root, process_set=mine) == root


def test_two_sets_use_the_same_name_side_by_side(sets, mode):
    mine, rank, size = sets.mine, hvd.rank(), hvd.size()
    if mine is hvd.global_process_set:
        # the two calls would be one name twice in one set, which inside
        # tf.function may be in flight at once
        pytest.skip("on one rank this rank's set is the global set itself")
    x = tf.constant(rank_values("tf.ps.same", rank, (5,)))

    def both(x):
        in_set = hvd.allreduce(x, op=hvd.Sum, name="tf.ps.same.name", process_set=mine)
        everyone = hvd.allreduce(x, op=hvd.Sum, name="tf.ps.same.name")
        return in_set, everyone
    in_set, everyone = mode(both)(x)
    np.testing.assert_array_equal(
        in_set.numpy(), sum(rank_values("tf.ps.same", r, (5,)) for r in mine.ranks))
    np.testing.assert_array_equal(
        everyone.numpy(), sum(rank_values("tf.ps.same", r, (5,)) for r in range(size)))


def test_unnamed_eager_calls_count_per_set(sets):
    mine, rank = sets.mine, hvd.rank()
    # members of different sets make different numbers of unnamed calls;
    # each set's automatic names must still match among its members
    extra = 1 + (mine is sets.evens)
    for _ in range(extra):
        got = hvd.allreduce(tf.constant([float(rank)]), op=hvd.Sum, process_set=mine)
        assert float(got.numpy()[0]) == float(sum(mine.ranks))
    got = hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)
    assert float(got.numpy()[0]) == float(hvd.size())


def _require_two_sets(sets):
    if sets.other is None:
        pytest.skip("needs two process sets (two or more ranks)")


def test_a_process_outside_the_set_is_refused(sets, mode):
    _require_two_sets(sets)
    other = sets.other
    match = (f"not in process set {other.process_set_id} "
             rf"\(rank{'s' if len(other.ranks) > 1 else ''} {other.ranks[0]}")
    calls = [
        lambda: hvd.allreduce(tf.ones([2]), process_set=other),
        lambda: hvd.grouped_allreduce([tf.ones([2])], process_set=other),
        lambda: hvd.allgather(tf.ones([1]), process_set=other),
        lambda: hvd.broadcast(tf.ones([1]), root_rank=other.ranks[0], process_set=other),
        lambda: hvd.alltoall(tf.ones([len(other.ranks)]), process_set=other),
        lambda: hvd.reducescatter(tf.ones([len(other.ranks)]), process_set=other),
        lambda: hvd.barrier(process_set=other),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=match) as caught:
            mode(call)()
        # Horovod's class for it too
        assert isinstance(caught.value, tf.errors.InvalidArgumentError)
    with pytest.raises(ValueError, match=match):
        hvd.allgather_object(1, process_set=other)


def test_a_root_outside_the_set_is_refused(sets, mode):
    _require_two_sets(sets)
    outsider = sets.other.ranks[0]
    with pytest.raises(ValueError, match=f"root rank {outsider} is not in process set"):
        mode(lambda: hvd.broadcast(tf.ones([2]), root_rank=outsider,
                                   process_set=sets.mine))()
    with pytest.raises(ValueError, match=f"root rank {outsider} is not in process set"):
        hvd.broadcast_variables([tf.Variable([1.0])], outsider, process_set=sets.mine)


def test_bad_process_set_arguments():
    # The same classes and words as every adapter (hora.common._adapter.checks).
    with pytest.raises(hora.HoraTypeError, match="must be one of hora's process sets"):
        hvd.allgather(tf.ones([1]), process_set="evens")
    with pytest.raises(hora.HoraInvalidArgumentError, match="is not registered"):
        hvd.DistributedGradientTape(tf.GradientTape(), process_set=hvd.ProcessSet([0]))
    with pytest.raises(hora.HoraInvalidArgumentError, match="is not registered"):
        hk.DistributedOptimizer(keras.optimizers.SGD(0.1), process_set=hvd.ProcessSet([0]))
    with pytest.raises(hora.HoraTypeError, match="dtype complex64 is not supported"):
        hvd.allreduce(tf.zeros([2], tf.complex64), name="tps.complex")


# --- training inside a set ---------------------------------------------------

def _train_linear(w, x, y, steps, make_tape, run):
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        grad = make_tape(tape).gradient(loss, w)
        w.assign_sub(0.1 * grad)
    step = run(step)
    for _ in range(steps):
        step(x, y)
    return w.numpy()


def test_distributed_gradient_tape_trains_like_one_process_on_the_sets_data(sets, mode):
    mine, rank = sets.mine, hvd.rank()
    start = rank_values("tf.ps.tape.w", 0, (3, 2))
    xs = members_values("tf.ps.tape.x", mine, (4, 3))
    ys = members_values("tf.ps.tape.y", mine, (4, 2))
    got = _train_linear(
        tf.Variable(start), tf.constant(xs[rank]), tf.constant(ys[rank]), 3,
        lambda tape: hvd.DistributedGradientTape(tape, process_set=mine), mode)
    want = _train_linear(
        tf.Variable(start), tf.constant(np.concatenate([xs[r] for r in mine.ranks])),
        tf.constant(np.concatenate([ys[r] for r in mine.ranks])), 3, lambda tape: tape,
        lambda fn: fn)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for other in hvd.allgather_object(got, process_set=mine):
        np.testing.assert_array_equal(other, got)


def test_gradient_tape_outside_its_set_keeps_local_gradients(sets, mode):
    _require_two_sets(sets)
    rank = hvd.rank()
    start = rank_values("tf.ps.tape2.w", 0, (3, 2))
    x = tf.constant(rank_values("tf.ps.tape2.x", rank, (4, 3)))
    y = tf.constant(rank_values("tf.ps.tape2.y", rank, (4, 2)))
    # as Horovod: no collective runs, the gradients come back unreduced
    got = _train_linear(tf.Variable(start), x, y, 2,
                        lambda tape: hvd.DistributedGradientTape(tape, process_set=sets.other),
                        mode)
    want = _train_linear(tf.Variable(start), x, y, 2, lambda tape: tape, lambda fn: fn)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_partial_tape_scales_local_gradients_by_the_sets_size(sets):
    mine = sets.mine
    layer = keras.layers.Dense(1, use_bias=False)
    layer.build((None, 2))
    x = tf.constant([[1.0, 2.0]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(x))
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=layer, process_set=mine)
    (grad,) = tape.gradient(loss, layer.trainable_weights)
    np.testing.assert_allclose(np.ravel(grad), np.array([1.0, 2.0]) / len(mine.ranks))


def _make_optimizer(kind):
    if kind == "legacy":
        return keras.optimizers.legacy.SGD(0.1, momentum=0.9)
    return keras.optimizers.SGD(0.1, momentum=0.9)


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


# Keras 2 also has its legacy optimizers; tests/test_tensorflow_suite.py runs
# this test with TF_USE_LEGACY_KERAS=1 too
@pytest.mark.parametrize("kind", ["new", "legacy"] if _flavor.LEGACY else ["new"])
def test_keras_distributed_optimizer_in_a_set(sets, kind):
    mine, size, rank = sets.mine, hvd.size(), hvd.rank()
    x, y = rank_data(size)
    root = mine.ranks[0]
    # different starting points on every rank, made equal inside the set
    model = keras_helpers.make_model(keras, seed=1 + rank)
    hvd.broadcast_variables(model.weights, root_rank=root, process_set=mine)
    opt = hk.DistributedOptimizer(_make_optimizer(kind), process_set=mine)
    model.compile(optimizer=opt, loss=_loss())
    model.fit(x[rank], y[rank], batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    reference = keras_helpers.make_model(keras, seed=1 + root)
    reference.compile(optimizer=_make_optimizer(kind), loss=_loss())
    gx, gy = global_batches(x[mine.ranks], y[mine.ranks], BATCH)
    reference.fit(gx, gy, batch_size=BATCH * len(mine.ranks), epochs=1, shuffle=False,
                  verbose=0)
    weights = model.get_weights()
    for other in hvd.allgather_object(weights, process_set=mine):
        for a, b in zip(other, weights):
            np.testing.assert_array_equal(a, b)
    for got, want in zip(weights, reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
