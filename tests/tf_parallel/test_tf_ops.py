"""hora.tensorflow collectives against NumPy references, eagerly and inside
tf.function, with their gradients and their errors."""

import numpy as np
import pytest
import tensorflow as tf

import hora
import hora.tensorflow as hvd
from conftest import rank_values

DTYPES = [tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16, tf.float32,
          tf.float64, tf.bool]


def inputs(tag, size, shape, dtype=tf.float32):
    """Every rank's input for `tag`, as NumPy arrays of `dtype`."""
    out = []
    for r in range(size):
        values = rank_values(tag, r, shape)
        if dtype == tf.bool:
            values = values > 0
        elif dtype.is_integer:
            values = np.abs(values * 2) if dtype.is_unsigned else values * 2
        out.append(tf.constant(values).numpy().astype(dtype.as_numpy_dtype))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_allreduce_sum_every_dtype(dtype, rank, size, mode):
    all_inputs = inputs(f"sum/{dtype.name}", size, (3, 5), dtype)
    run = mode(lambda x: hvd.allreduce(x, op=hvd.Max if dtype == tf.bool else hvd.Sum,
                                       name=f"sum.{dtype.name}"))
    result = run(tf.constant(all_inputs[rank], dtype=dtype))
    assert result.dtype == dtype and result.shape == (3, 5)
    if dtype == tf.bool:
        expected = np.logical_or.reduce(all_inputs)
    else:
        expected = np.sum(np.stack(all_inputs).astype(np.float64), axis=0)
    np.testing.assert_allclose(result.numpy().astype(np.float64), expected.astype(np.float64))


@pytest.mark.parametrize("op", [hvd.Average, hvd.Min, hvd.Max, hvd.Product])
def test_allreduce_ops_and_scaling(op, rank, size, mode):
    all_inputs = inputs(f"op/{op}", size, (7,))
    run = mode(lambda x: hvd.allreduce(x, op=op, prescale_factor=2.0, postscale_factor=0.5))
    stacked = np.stack(all_inputs).astype(np.float64)
    reference = {hvd.Average: np.mean, hvd.Min: np.min, hvd.Max: np.max,
                 hvd.Product: np.prod}[op]
    expected = reference(stacked * 2.0, axis=0) * 0.5
    np.testing.assert_allclose(run(tf.constant(all_inputs[rank])).numpy(), expected, rtol=1e-6)


def test_allreduce_fp16_compression_keeps_dtype(rank, size, mode):
    all_inputs = inputs("fp16", size, (4, 4))
    run = mode(lambda x: hvd.allreduce(x, compression=hvd.Compression.fp16))
    result = run(tf.constant(all_inputs[rank]))
    assert result.dtype == tf.float32
    np.testing.assert_allclose(result.numpy(), np.mean(all_inputs, axis=0), rtol=1e-3)


def test_grouped_allreduce_mixed_shapes(rank, size, mode):
    shapes = [(3,), (2, 2), (1,), (0,)]
    per_tensor = [inputs(f"group/{i}", size, s) for i, s in enumerate(shapes)]
    run = mode(lambda *xs: hvd.grouped_allreduce(list(xs), op=hvd.Sum))
    results = run(*[tf.constant(t[rank]) for t in per_tensor])
    for result, all_inputs in zip(results, per_tensor):
        np.testing.assert_allclose(result.numpy(), np.sum(all_inputs, axis=0))


def test_allreduce_of_indexed_slices_gathers_rows(rank, size):
    values = tf.constant(np.full((2, 3), rank + 1, np.float32))
    slices = tf.IndexedSlices(values, tf.constant([rank, rank + 1], tf.int64),
                              dense_shape=tf.constant([size + 1, 3], tf.int64))
    result = hvd.allreduce(slices, op=hvd.Average)
    assert isinstance(result, tf.IndexedSlices)
    np.testing.assert_array_equal(result.indices.numpy(),
                                  np.concatenate([[r, r + 1] for r in range(size)]))
    expected_values = np.concatenate([np.full((2, 3), r + 1) for r in range(size)]) / size
    np.testing.assert_allclose(result.values.numpy(), expected_values)
    dense = tf.convert_to_tensor(result).numpy()
    expected = np.zeros((size + 1, 3))
    for r in range(size):
        expected[[r, r + 1]] += (r + 1) / size
    np.testing.assert_allclose(dense, expected)


def test_allgather_ragged_first_dimension(rank, size, mode):
    all_inputs = [rank_values("gather", r, (r + 1, 2)) for r in range(size)]
    result = mode(lambda x: hvd.allgather(x))(tf.constant(all_inputs[rank]))
    np.testing.assert_array_equal(result.numpy(), np.concatenate(all_inputs))


def test_grouped_allgather(rank, size, mode):
    a = [rank_values("ga", r, (r + 1,)) for r in range(size)]
    b = [np.full((1, 2), r, np.int32) for r in range(size)]
    out = mode(lambda x, y: hvd.grouped_allgather([x, y]))(tf.constant(a[rank]),
                                                           tf.constant(b[rank]))
    np.testing.assert_array_equal(out[0].numpy(), np.concatenate(a))
    np.testing.assert_array_equal(out[1].numpy(), np.concatenate(b))


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.int64, tf.bool], ids=lambda d: d.name)
def test_broadcast_from_each_root(dtype, rank, size, mode):
    for root in range(size):
        all_inputs = inputs(f"bcast/{root}/{dtype.name}", size, (2, 3), dtype)
        result = mode(lambda x, root=root: hvd.broadcast(x, root))(
            tf.constant(all_inputs[rank], dtype))
        np.testing.assert_array_equal(result.numpy(), all_inputs[root])


def test_broadcast_variables_assigns_root_values(rank, size, mode):
    variables = [tf.Variable(rank_values("bv", rank, (3,))), tf.Variable(rank * 10, tf.int64)]

    def body():
        hvd.broadcast_variables(variables, root_rank=size - 1)
    mode(body)()
    np.testing.assert_array_equal(variables[0].numpy(), rank_values("bv", size - 1, (3,)))
    assert variables[1].numpy() == (size - 1) * 10


def test_broadcast_inplace_returns_the_broadcast_values(rank, size, mode):
    """As Horovod's: ``v, = hvd.broadcast_([var], root)`` gives the values
    after the broadcast, eagerly and inside tf.function."""
    root = size - 1
    a = tf.Variable(rank_values("bcast_.a", rank, (3,)))
    b = tf.Variable(rank * 10 + 1, dtype=tf.int64)

    def body():
        values = hvd.broadcast_([a, b], root, name="tf.broadcast_.values")
        assert isinstance(values, list) and len(values) == 2
        assert all(isinstance(v, tf.Tensor) for v in values)
        return values, values[0] * 2.0
    values, doubled = mode(body)()
    np.testing.assert_array_equal(values[0].numpy(), rank_values("bcast_.a", root, (3,)))
    np.testing.assert_array_equal(doubled.numpy(), 2.0 * rank_values("bcast_.a", root, (3,)))
    assert values[1].dtype == tf.int64 and int(values[1].numpy()) == root * 10 + 1
    # in place as well
    np.testing.assert_array_equal(a.numpy(), rank_values("bcast_.a", root, (3,)))
    assert int(b.numpy()) == root * 10 + 1
    assert mode(lambda: hvd.broadcast_([], root))() == []


def test_alltoall_with_and_without_splits(rank, size, mode):
    # rank r sends (d + 1) rows to rank d, each row holding 100 * r + d
    splits = [d + 1 for d in range(size)]
    rows = np.concatenate([np.full((d + 1, 2), 100 * rank + d, np.float32) for d in range(size)])
    output, received = mode(lambda x: hvd.alltoall(x, splits=splits))(tf.constant(rows))
    np.testing.assert_array_equal(received.numpy(), [rank + 1] * size)
    expected = np.concatenate([np.full((rank + 1, 2), 100 * r + rank) for r in range(size)])
    np.testing.assert_array_equal(output.numpy(), expected)
    # without splits only the output comes back, as in Horovod
    even = mode(lambda x: hvd.alltoall(x))(tf.range(size * 2) + 10 * rank)
    np.testing.assert_array_equal(even.numpy(),
                                  np.concatenate([[10 * r + 2 * rank, 10 * r + 2 * rank + 1]
                                                  for r in range(size)]))


def test_reducescatter_uneven_rows(rank, size, mode):
    rows = 2 * size + 1
    all_inputs = inputs("rs", size, (rows, 3))
    result = mode(lambda x: hvd.reducescatter(x, op=hvd.Sum))(tf.constant(all_inputs[rank]))
    counts = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    np.testing.assert_allclose(result.numpy(),
                               np.sum(all_inputs, axis=0)[start:start + counts[rank]])
    grouped = mode(lambda x: hvd.grouped_reducescatter([x, x * 2]))(tf.constant(all_inputs[rank]))
    np.testing.assert_allclose(grouped[1].numpy(),
                               2 * np.mean(all_inputs, axis=0)[start:start + counts[rank]],
                               rtol=1e-6)


def test_runtime_ops_and_objects(rank, size, mode):
    values = mode(lambda: (hvd.size_op(), hvd.rank_op(), hvd.local_size_op(), hvd.barrier()))()
    assert [int(v) for v in values] == [size, rank, hvd.local_size(), 0]
    assert hvd.broadcast_object({"from": rank}, root_rank=0) == {"from": 0}
    assert hvd.allgather_object(rank * 2) == [2 * r for r in range(size)]
    assert int(mode(lambda: hvd.join())()) in range(size)


# --- gradients -----------------------------------------------------------------

def gradient(mode, fn, x):
    def body(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return tape.gradient(y, x)
    return mode(body)(x)


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average])
def test_allreduce_gradient(op, rank, size, mode):
    # loss_r = sum(w_r * allreduce(x)); d/dx_r of the sum over ranks of loss_r
    weights = [rank_values("w", r, (4,)) for r in range(size)]
    x = tf.constant(rank_values("x", rank, (4,)))
    grad = gradient(mode, lambda x: tf.reduce_sum(weights[rank] * hvd.allreduce(x, op=op)), x)
    expected = np.sum(weights, axis=0) / (size if op == hvd.Average else 1)
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-6)


def test_allgather_gradient_is_own_rows_of_the_average(rank, size, mode):
    rows = [r + 1 for r in range(size)]
    total = sum(rows)
    weights = [rank_values("gw", r, (total, 2)) for r in range(size)]
    x = tf.constant(rank_values("gx", rank, (rows[rank], 2)))
    grad = gradient(mode, lambda x: tf.reduce_sum(weights[rank] * hvd.allgather(x)), x)
    start = sum(rows[:rank])
    # Horovod's gradient: the gradient averaged over ranks
    np.testing.assert_allclose(grad.numpy(), np.mean(weights, axis=0)[start:start + rows[rank]],
                               rtol=1e-6)


def test_broadcast_and_reducescatter_gradients(rank, size, mode):
    weights = [rank_values("bw", r, (3,)) for r in range(size)]
    x = tf.constant(rank_values("bx", rank, (3,)))
    grad = gradient(mode, lambda x: tf.reduce_sum(weights[rank] * hvd.broadcast(x, 0)), x)
    # Horovod's gradients: broadcast averages over ranks on the root ...
    expected = np.mean(weights, axis=0) if rank == 0 else np.zeros(3)
    np.testing.assert_allclose(grad.numpy(), expected, rtol=1e-6)
    rows = 2 * size
    x = tf.constant(rank_values("rsx", rank, (rows, 1)))
    w = [rank_values("rsw", r, (2, 1)) for r in range(size)]
    # ... and reducescatter gathers the gradient, times size() for Sum
    grad = gradient(mode, lambda x: tf.reduce_sum(w[rank] * hvd.reducescatter(x, op=hvd.Sum)), x)
    np.testing.assert_allclose(grad.numpy(), size * np.concatenate(w), rtol=1e-6)
    grad = gradient(mode, lambda x: tf.reduce_sum(
        w[rank] * hvd.reducescatter(x, op=hvd.Average, prescale_factor=2.0)), x)
    np.testing.assert_allclose(grad.numpy(), 2.0 * np.concatenate(w), rtol=1e-6)


def test_alltoall_gradient_sends_rows_back(rank, size, mode):
    weights = [rank_values("a2aw", r, (size, 2)) for r in range(size)]
    x = tf.constant(rank_values("a2ax", rank, (size, 2)))
    grad = gradient(mode, lambda x: tf.reduce_sum(weights[rank] * hvd.alltoall(x)), x)
    # row d of x went to rank d, where it is row `rank` of the output
    np.testing.assert_allclose(grad.numpy(), np.stack([weights[d][rank] for d in range(size)]))


# --- errors ----------------------------------------------------------------------

def test_mismatched_shapes_raise_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    # Horovod's class, still hora's too
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"shape.*'tf.shape.eager'.*rank 0") as caught:
        hvd.allreduce(tf.zeros([rank + 1]), name="tf.shape.eager")
    assert isinstance(caught.value, hora.HoraMismatchError)

    @tf.function(jit_compile=False)
    def in_graph(x):
        return hvd.allreduce(x, name="tf.shape.graph")
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=r"(?s)Mismatched shape.*'tf.shape.graph'") as caught:
        in_graph(tf.zeros([rank + 1]))
    assert isinstance(caught.value, hora.HoraMismatchError)
    # the job is still usable afterwards
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum)) == size


def _in_a_function(collective, x):
    return tf.function(collective, jit_compile=False)(x)


def _in_a_dataset_map(collective, x):
    return list(tf.data.Dataset.from_tensors(x).map(collective))


@pytest.mark.parametrize("where", [_in_a_function, _in_a_dataset_map],
                         ids=["function", "dataset_map"])
def test_errors_in_graphs_have_horovods_classes(where, rank, size):
    """A collective that fails when it runs in a graph (a tf.function, a
    tf.data map) fails the call, or the iteration, with the tf.errors class
    Horovod's kernels give, still hora's class too, on every rank."""
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    tag = where.__name__
    with pytest.raises(tf.errors.FailedPreconditionError,
                       match=rf"(?s)Mismatched shape.*'tf.mismatch{tag}'.*rank 0") as caught:
        where(lambda x: hvd.allreduce(x, name=f"tf.mismatch{tag}"), tf.zeros([rank + 1]))
    assert isinstance(caught.value, hora.HoraMismatchError)
    # an argument the collective refuses when it runs: rows that do not divide
    rows = 2 * size - 1
    refused = rf"(?s)'tf.uneven{tag}'.*first dimension {rows}, {size} ranks"
    with pytest.raises(tf.errors.InvalidArgumentError, match=refused) as caught:
        where(lambda x: hvd.alltoall(x, name=f"tf.uneven{tag}"), tf.zeros([rows]))
    assert isinstance(caught.value, hora.HoraInvalidArgumentError)
    assert isinstance(caught.value, ValueError)
    # every rank got both
    assert hvd.allgather_object(tag) == [tag] * size
    # errors that are not hora's keep TensorFlow's classes
    def fails(x):
        raise RuntimeError(f"not hora's {tag}")
    with pytest.raises(tf.errors.UnknownError, match=f"not hora's {tag}") as caught:
        where(lambda x: tf.numpy_function(fails, [x], tf.float32), tf.zeros([1]))
    assert type(caught.value) is tf.errors.UnknownError
    assert float(hvd.allreduce(tf.constant(1.0), op=hvd.Sum, name=f"tf.after{tag}")) == size


def test_bad_arguments_raise_at_once():
    with pytest.raises(TypeError, match="dtype uint32 is not supported"):
        hvd.allreduce(tf.zeros([2], tf.uint32))
    with pytest.raises(ValueError, match="dtype uint32 is not supported"):
        hvd.allreduce(tf.zeros([2], tf.uint32))
    slices = tf.IndexedSlices(tf.zeros([1, 2]), tf.constant([0]))
    with pytest.raises(NotImplementedError, match="Only Sum and Average ops are supported"):
        hvd.allreduce(slices, op=hvd.Max)
    with pytest.raises(NotImplementedError, match="Pre/postscale_factor are not supported"):
        hvd.allreduce(slices, prescale_factor=2.0)
    with pytest.raises(NotImplementedError, match="Pre/postscale_factor are not supported"):
        hvd.grouped_allreduce([tf.zeros([2]), slices], postscale_factor=0.5)
    with pytest.raises(ValueError, match="cannot gather a scalar"):
        hvd.allgather(tf.constant(1.0))
    with pytest.raises(TypeError, match="must be one of hora's process sets"):
        hvd.allreduce(tf.zeros([1]), process_set=object())
    with pytest.raises(ValueError, match="is not registered"):
        hvd.allreduce(tf.zeros([1]), process_set=hvd.ProcessSet([0]))


def test_xla_compilation_is_refused_with_advice():
    @tf.function(jit_compile=True)
    def compiled(x):
        return hvd.allreduce(x)
    with pytest.raises(Exception, match="jit_compile=False"):
        compiled(tf.zeros([2]))


def test_collectives_run_their_python_unconverted_inside_tf_function(monkeypatch, rank, size):
    """AutoGraph converts the user's tf.function and what it calls; the
    Python a collective runs every step (the function handed to
    tf.numpy_function) is hora's own code, not an AutoGraph rewrite of it
    running through AutoGraph's loop operators, while what hora calls of
    the user's (a compressor with Python control flow on tensors) is still
    converted, as in Horovod."""
    handed = []
    original = tf.numpy_function

    def recording(func, *args, **kwargs):
        handed.append(func)
        return original(func, *args, **kwargs)

    monkeypatch.setattr(tf, "numpy_function", recording)

    class SignDependent(hvd.Compression.none):
        """Sends tensors as they are, with a branch on a tensor's value that
        only works when AutoGraph converts it."""

        @staticmethod
        def compress(tensor):
            if tf.reduce_sum(tensor) >= 0:
                tensor = tensor * 1.0
            else:
                tensor = tensor * 1.0
            return tensor, None

    variables = [tf.Variable(tf.ones([3]) * (rank + 1)), tf.Variable(tf.ones([2, 2]))]

    @tf.function(jit_compile=False)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * v) for v in variables])
        tape = hvd.DistributedGradientTape(tape, compression=SignDependent)
        grads = tape.gradient(loss, variables)
        others = [hvd.grouped_allreduce([variables[0] * 1.0, variables[1] * 1.0]),
                  hvd.allgather(variables[0] * 1.0), hvd.broadcast(variables[1] * 1.0, 0),
                  hvd.alltoall(tf.ones([size]) * rank), hvd.reducescatter(tf.ones([size, 2])),
                  hvd.size_op(), hvd.barrier()]
        return grads, others

    grads, _ = step()
    # one per collective of step(), and the tape's reduction where there is
    # anything to reduce (on one rank the gradients are returned as they are)
    assert len(handed) == (8 if size > 1 else 7), [func.__qualname__ for func in handed]
    for func in handed:
        source = func.__code__.co_filename
        assert "__autograph_generated" not in source, (func, source)
        assert func.__module__.startswith("hora."), func
    mean = (size + 1) / 2
    np.testing.assert_allclose(grads[0].numpy(), np.full([3], 2 * mean))
    np.testing.assert_allclose(grads[1].numpy(), np.full([2, 2], 2.0))


def test_eager_reductions_reuse_their_result_arrays(rank, size):
    """Eagerly, every call names its collectives anew; the arrays the
    averaged gradients land in are still kept per result, not per call."""
    variables = [tf.Variable(tf.ones([64]) * (rank + 1)), tf.Variable(tf.ones([8, 8]))]
    reducer = None
    for _ in range(6):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v * v) for v in variables])
        tape = hvd.DistributedGradientTape(tape)
        reducer = reducer or tape._hora_reducer
        tape._hora_reducer = reducer
        grads = tape.gradient(loss, variables)
        np.testing.assert_allclose(grads[0].numpy(), np.full([64], (size + 1.0)))
    kept = reducer._outputs._arrays
    assert sum(len(arrays) for arrays in kept.values()) <= reducer._outputs.per_slot * 2, kept
