"""hora.mxnet collectives against NumPy references, and their errors."""

import mxnet as mx
import numpy as np
import pytest

import hora
import hora.mxnet as hvd
from conftest import rank_values

DTYPES = [np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64]


def all_inputs(tag, size, shape, dtype=np.float32):
    return [rank_values(tag, r, shape, dtype) for r in range(size)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_sum_every_dtype(dtype, rank, size):
    inputs = all_inputs(f"sum/{np.dtype(dtype).name}", size, (3, 5), dtype)
    x = mx.nd.array(inputs[rank], dtype=dtype)
    result = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{np.dtype(dtype).name}")
    assert result.dtype == np.dtype(dtype) and result.shape == (3, 5)
    np.testing.assert_allclose(result.asnumpy().astype(np.float64),
                               np.sum(np.stack(inputs).astype(np.float64), axis=0))
    np.testing.assert_array_equal(x.asnumpy(), inputs[rank])  # the input is left alone


@pytest.mark.parametrize("op", [hvd.Average, hvd.Min, hvd.Max, hvd.Product])
def test_allreduce_ops_scaling_and_in_place(op, rank, size):
    inputs = all_inputs(f"op/{op}", size, (7,))
    reference = {hvd.Average: np.mean, hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}[op]
    expected = reference(np.stack(inputs).astype(np.float64) * 2.0, axis=0) * 0.5
    x = mx.nd.array(inputs[rank])
    same = hvd.allreduce_(x, op=op, prescale_factor=2.0, postscale_factor=0.5)
    assert same is x
    np.testing.assert_allclose(x.asnumpy(), expected, rtol=1e-6)


def test_allreduce_after_pending_mxnet_work(rank, size):
    # the array is produced by MXNet's asynchronous engine: hora must wait for it
    base = mx.nd.ones((256, 256)) * (rank + 1)
    produced = mx.nd.dot(base, mx.nd.ones((256, 256)))
    hvd.allreduce_(produced, op=hvd.Sum, name="pending")
    np.testing.assert_allclose(produced.asnumpy(), 256.0 * sum(range(1, size + 1)))


def test_grouped_allreduce(rank, size):
    shapes = [(3,), (2, 2), (1,)]
    inputs = [all_inputs(f"group/{i}", size, s) for i, s in enumerate(shapes)]
    arrays = [mx.nd.array(t[rank]) for t in inputs]
    results = hvd.grouped_allreduce(arrays, op=hvd.Sum)
    for result, expected in zip(results, inputs):
        np.testing.assert_allclose(result.asnumpy(), np.sum(expected, axis=0))
    hvd.grouped_allreduce_(arrays)
    for array, expected in zip(arrays, inputs):
        np.testing.assert_allclose(array.asnumpy(), np.mean(expected, axis=0), rtol=1e-6)


def test_allgather_ragged_first_dimension(rank, size):
    inputs = [rank_values("gather", r, (r + 1, 2)) for r in range(size)]
    result = hvd.allgather(mx.nd.array(inputs[rank]))
    np.testing.assert_array_equal(result.asnumpy(), np.concatenate(inputs))


@pytest.mark.parametrize("dtype", [np.float16, np.int64])
def test_broadcast_from_each_root(dtype, rank, size):
    for root in range(size):
        inputs = all_inputs(f"bcast/{root}", size, (2, 3), dtype)
        x = mx.nd.array(inputs[rank], dtype=dtype)
        np.testing.assert_array_equal(hvd.broadcast(x, root).asnumpy(), inputs[root])
        hvd.broadcast_(x, root)
        np.testing.assert_array_equal(x.asnumpy(), inputs[root])


def test_alltoall_and_reducescatter(rank, size):
    splits = [d + 1 for d in range(size)]
    rows = np.concatenate([np.full((d + 1, 2), 100 * rank + d, np.float32) for d in range(size)])
    output, received = hvd.alltoall(mx.nd.array(rows), splits=mx.nd.array(splits, dtype="int32"))
    expected = np.concatenate([np.full((rank + 1, 2), 100 * r + rank) for r in range(size)])
    np.testing.assert_array_equal(output.asnumpy(), expected)
    assert received.asnumpy().tolist() == [rank + 1] * size
    count = 2 * size + 1
    inputs = all_inputs("rs", size, (count, 3))
    result = hvd.reducescatter(mx.nd.array(inputs[rank]), op=hvd.Sum)
    counts = [count // size + (1 if r < count % size else 0) for r in range(size)]
    start = sum(counts[:rank])
    np.testing.assert_allclose(result.asnumpy(),
                               np.sum(inputs, axis=0)[start:start + counts[rank]])


def test_objects_barrier_and_join(rank, size):
    assert hvd.broadcast_object({"from": rank}, root_rank=size - 1) == {"from": size - 1}
    assert hvd.allgather_object(rank * 3) == [3 * r for r in range(size)]
    hvd.barrier()
    assert hvd.join() in range(size)


def test_mismatched_shapes_raise_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    with pytest.raises(hora.HoraMismatchError, match=r"shape.*'mx.shape'.*rank 0"):
        hvd.allreduce(mx.nd.zeros((rank + 1,)), name="mx.shape")
    assert float(hvd.allreduce(mx.nd.ones((1,)), op=hvd.Sum).asscalar()) == size


def test_bad_arguments_raise_at_once():
    with pytest.raises(TypeError, match="expected an mxnet.nd.NDArray"):
        hvd.allreduce(np.zeros(2))
    with pytest.raises(ValueError, match="row_sparse arrays are not supported"):
        hvd.allreduce(mx.nd.zeros((2, 2)).tostype("row_sparse"))
    with pytest.raises(ValueError, match="cannot split a scalar"):
        hvd.allgather(mx.nd.array(np.float32(1.0).reshape(())))
    with pytest.raises(ValueError, match="process sets"):
        hvd.allreduce(mx.nd.zeros((1,)), process_set=object())


def test_the_exception_classes_are_horas():
    from hora.common import exceptions
    for name in ("HoraError", "HoraInternalError", "HoraInvalidArgumentError",
                 "HoraMismatchError", "HoraShutdownError", "HoraTimeoutError", "HoraTypeError",
                 "HorovodInternalError"):
        assert getattr(hvd, name) is getattr(exceptions, name), name
        assert name in hvd.__all__, name
