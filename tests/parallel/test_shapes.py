"""Unusual shapes: 0-d scalars, empty arrays, odd sizes, fewer rows than
ranks and 3-d tensors, for every kind of collective."""

import numpy as np
import pytest

import hora
from conftest import rank_input
from hora_reference import (assert_reduced, assert_same, inputs_of, reduce_reference,
                            reducescatter_block, reducescatter_rows)


@pytest.mark.parametrize("dtype", [np.int32, np.float16, np.float64, np.bool_],
                         ids=lambda d: np.dtype(d).name)
def test_allreduce_0d(dtype, rank, size):
    tag = f"shapes.0d.{np.dtype(dtype).name}"
    x = rank_input(tag, rank, (), dtype)
    assert x.shape == ()
    results = {op: hora.allreduce(x, name=f"{tag}.{int(op)}", op=op)
               for op in (hora.Sum, hora.Min, hora.Max)}
    everyone = inputs_of(tag, range(size), (), dtype)
    for op, result in results.items():
        assert_same(result, reduce_reference(everyone, op, dtype))


def test_allreduce_numpy_and_python_scalars(rank, size):
    by_numpy = hora.allreduce(np.float32(rank), name="shapes.scalar.numpy", op=hora.Sum)
    by_python = hora.allreduce(rank + 1, name="shapes.scalar.python", op=hora.Sum)
    total = size * (size - 1) // 2
    assert_same(by_numpy, np.array(total, np.float32))
    assert by_python.shape == ()
    assert int(by_python) == total + size


def test_broadcast_0d(rank, size):
    x = np.array(10 * rank + 7, np.int64)
    results = [hora.broadcast(x, root, name=f"shapes.0d.broadcast.{root}") for root in range(size)]
    for root, result in enumerate(results):
        assert_same(result, np.array(10 * root + 7, np.int64))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 2)], ids=str)
def test_empty_arrays(shape, rank, size):
    tag = f"shapes.empty.{len(shape)}.{shape[0]}"
    x = np.zeros(shape, np.float32)
    reduced = hora.allreduce(x, name=tag + ".allreduce", op=hora.Sum)
    inplace = hora.allreduce_(np.zeros(shape, np.int8), name=tag + ".allreduce_", op=hora.Max)
    gathered = hora.allgather(x, name=tag + ".allgather")
    broadcast = hora.broadcast(x, 0, name=tag + ".broadcast")

    assert_same(reduced, np.zeros(shape, np.float32))
    assert_same(inplace, np.zeros(shape, np.int8))
    assert_same(gathered, np.zeros((shape[0] * size,) + shape[1:], np.float32))
    assert_same(broadcast, np.zeros(shape, np.float32))


def test_empty_alltoall_and_reducescatter(rank, size):
    x = np.zeros((0, 3), np.int32)
    output, received = hora.alltoall(x, name="shapes.empty.alltoall")
    uneven_out, uneven_received = hora.alltoall(x, splits=[0] * size,
                                                name="shapes.empty.alltoall.splits")
    scattered = hora.reducescatter(x, name="shapes.empty.reducescatter", op=hora.Sum)

    for out, rec in ((output, received), (uneven_out, uneven_received)):
        assert_same(out, np.zeros((0, 3), np.int32))
        assert_same(rec, np.zeros(size, np.int64))
    assert_same(scattered, np.zeros((0, 3), np.int32))


@pytest.mark.parametrize("count", [1, 7, 13, 1023, 4099])
def test_odd_sizes_allreduce(count, rank, size):
    tag = f"shapes.odd.{count}"
    x32 = rank_input(tag, rank, (count,), np.float32)
    xi8 = rank_input(tag + ".i8", rank, (count,), np.int8)
    xf16 = rank_input(tag + ".f16", rank, (count,), np.float16)
    r32 = hora.allreduce(x32, name=tag, op=hora.Sum)
    ri8 = hora.allreduce(xi8, name=tag + ".i8", op=hora.Average)
    rf16 = hora.allreduce(xf16, name=tag + ".f16", op=hora.Max)

    assert_same(r32, reduce_reference(inputs_of(tag, range(size), (count,), np.float32),
                                      hora.Sum, np.float32))
    assert_same(ri8, reduce_reference(inputs_of(tag + ".i8", range(size), (count,), np.int8),
                                      hora.Average, np.int8))
    assert_same(rf16, reduce_reference(inputs_of(tag + ".f16", range(size), (count,), np.float16),
                                       hora.Max, np.float16))


def test_fewer_rows_than_ranks(rank, size):
    # One row in total: reducescatter gives it to rank 0 and nothing to the
    # others; allgather has one row from rank 0 only; alltoall sends one
    # row to the last rank.
    tag = "shapes.few"
    one_row = rank_input(tag, rank, (1, 5), np.float64)
    scattered = hora.reducescatter(one_row, name=tag + ".reducescatter", op=hora.Sum)
    gathered = hora.allgather(one_row[:1 if rank == 0 else 0], name=tag + ".allgather")
    splits = [0] * (size - 1) + [1]
    output, received = hora.alltoall(one_row, splits=splits, name=tag + ".alltoall")

    full = reduce_reference(inputs_of(tag, range(size), (1, 5), np.float64), hora.Sum, np.float64)
    assert scattered.shape == (reducescatter_rows(1, size)[rank], 5)
    assert_same(scattered, reducescatter_block(full, rank, size))
    assert_same(gathered, rank_input(tag, 0, (1, 5), np.float64))
    if rank == size - 1:
        assert_same(output, np.concatenate(inputs_of(tag, range(size), (1, 5), np.float64)))
        assert_same(received, np.ones(size, np.int64))
    else:
        assert_same(output, np.zeros((0, 5), np.float64))
        assert_same(received, np.zeros(size, np.int64))


def test_3d_every_collective(rank, size):
    tag = "shapes.3d"
    shape = (size + 1, 3, 2)
    x = rank_input(tag, rank, shape, np.int16)
    reduced = hora.allreduce(x, name=tag + ".allreduce", op=hora.Sum)
    gathered = hora.allgather(x, name=tag + ".allgather")
    broadcast = hora.broadcast(x, size - 1, name=tag + ".broadcast")
    even = rank_input(tag + ".even", rank, (size * 2, 3, 2), np.int16)
    exchanged, received = hora.alltoall(even, name=tag + ".alltoall")
    scattered = hora.reducescatter(x, name=tag + ".reducescatter", op=hora.Max)

    everyone = inputs_of(tag, range(size), shape, np.int16)
    assert_same(reduced, reduce_reference(everyone, hora.Sum, np.int16))
    assert_same(gathered, np.concatenate(everyone))
    assert_same(broadcast, everyone[size - 1])
    evens = inputs_of(tag + ".even", range(size), (size * 2, 3, 2), np.int16)
    assert_same(exchanged, np.concatenate([e[2 * rank:2 * rank + 2] for e in evens]))
    assert_same(received, np.full(size, 2, np.int64))
    assert_same(scattered, reducescatter_block(reduce_reference(everyone, hora.Max, np.int16),
                                               rank, size))


def test_large_allreduce(rank, size):
    # Big enough to take a different path in MPI than the small tensors.
    tag = "shapes.large"
    count = 1 << 18
    x = np.arange(count, dtype=np.float32) * (rank + 1)
    result = hora.allreduce(x, name=tag, op=hora.Sum)
    expected = np.arange(count, dtype=np.float32) * np.float32(size * (size + 1) // 2)
    assert_same(result, expected)


def test_average_of_odd_shape(rank, size):
    tag = "shapes.average.odd"
    x = rank_input(tag, rank, (3, 5, 7), np.float32)
    result = hora.allreduce(x, name=tag)
    expected = reduce_reference(inputs_of(tag, range(size), (3, 5, 7), np.float32),
                                hora.Average, np.float32)
    assert_reduced(result, expected, hora.Average)
