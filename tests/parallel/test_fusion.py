"""Many small tensors in flight at once: fusion, the response cache and
per-rank submission order."""

import numpy as np

import hora
from conftest import rank_input
from hora_reference import assert_reduced, assert_same, inputs_of, reduce_reference

COUNT = 200
DTYPES = [np.float32, np.int32, np.float16, np.float64, np.int8]
OPS = [hora.Sum, hora.Sum, hora.Max, hora.Sum, hora.Average, hora.Min]


def spec(i):
    """(shape, dtype, op) of tensor i: sizes 1..31 elements, runs of equal
    dtype and op (fusable) broken up by others."""
    dtype = DTYPES[(i // 5) % len(DTYPES)]
    op = OPS[(i // 3) % len(OPS)]
    return ((i * 7) % 31 + 1,), dtype, op


def submit_all(tag, rank, order):
    handles = {}
    for i in order:
        shape, dtype, op = spec(i)
        x = rank_input(f"{tag}.{i}", rank, shape, dtype)
        handles[i] = hora.allreduce_async(x, name=f"{tag}.{i}", op=op)
    return {i: hora.synchronize(h) for i, h in handles.items()}


def check_all(tag, results, size):
    assert sorted(results) == list(range(COUNT))
    for i in range(COUNT):
        shape, dtype, op = spec(i)
        expected = reduce_reference(inputs_of(f"{tag}.{i}", range(size), shape, dtype), op, dtype)
        assert_reduced(results[i], expected, op)


def test_many_small_allreduces_twice(rank, size):
    # The second round has the same names and parameters, so every tensor
    # is answered from the response cache instead of being negotiated.
    tag = "fusion.twice"
    first = submit_all(tag, rank, range(COUNT))
    second = submit_all(tag, rank, range(COUNT))
    check_all(tag, first, size)
    check_all(tag, second, size)


def test_order_differs_between_ranks(rank, size):
    tag = "fusion.order"
    order = list(range(COUNT))
    if rank % 2 == 1:
        order.reverse()
    first = submit_all(tag, rank, order)
    second = submit_all(tag, rank, order)  # cached, still in a different order per rank
    check_all(tag, first, size)
    check_all(tag, second, size)


def test_shuffled_order_per_rank(rank, size):
    tag = "fusion.shuffled"
    order = np.random.default_rng(1000 + rank).permutation(COUNT).tolist()
    results = submit_all(tag, rank, order)
    check_all(tag, results, size)


def test_many_inplace_async(rank, size):
    tag = "fusion.inplace"
    arrays = [rank_input(f"{tag}.{i}", rank, (i % 9 + 1,), np.float32) for i in range(60)]
    handles = [hora.allreduce_async_(x, name=f"{tag}.{i}", op=hora.Sum)
               for i, x in enumerate(arrays)]
    results = [hora.synchronize(h) for h in handles]
    for i, (x, result) in enumerate(zip(arrays, results)):
        assert result is x
        expected = reduce_reference(inputs_of(f"{tag}.{i}", range(size), (i % 9 + 1,), np.float32),
                                    hora.Sum, np.float32)
        assert_same(x, expected)


def test_mixed_kinds_in_flight(rank, size):
    # Allreduces interleaved with the other collectives, all in flight
    # together; the allreduces around a broadcast must not fuse across it.
    tag = "fusion.kinds"
    handles = []
    for i in range(30):
        x = rank_input(f"{tag}.{i}", rank, (i % 4 + 1, 2), np.int32)
        kind = i % 3
        if kind == 0:
            handles.append(hora.allreduce_async(x, name=f"{tag}.{i}", op=hora.Sum))
        elif kind == 1:
            handles.append(hora.broadcast_async(x, i % size, name=f"{tag}.{i}"))
        else:
            handles.append(hora.allgather_async(x, name=f"{tag}.{i}"))
    results = [hora.synchronize(h) for h in handles]

    for i, result in enumerate(results):
        shape = (i % 4 + 1, 2)
        everyone = inputs_of(f"{tag}.{i}", range(size), shape, np.int32)
        if i % 3 == 0:
            assert_same(result, reduce_reference(everyone, hora.Sum, np.int32))
        elif i % 3 == 1:
            assert_same(result, everyone[i % size])
        else:
            assert_same(result, np.concatenate(everyone))


def test_cached_name_with_new_parameters_on_every_rank(rank, size):
    # Reusing a name with a new shape, dtype, op or kind on all ranks is not
    # an error: the cached entry is replaced.
    tag = "fusion.recache"
    a = hora.allreduce(np.full(3, rank, np.int32), name=tag, op=hora.Sum)
    b = hora.allreduce(np.full(3, rank, np.int32), name=tag, op=hora.Sum)  # cached
    c = hora.allreduce(np.full(4, rank, np.int32), name=tag, op=hora.Sum)  # new shape
    d = hora.allreduce(np.full(4, rank, np.float64), name=tag, op=hora.Sum)  # new dtype
    e = hora.allreduce(np.full(4, rank, np.float64), name=tag, op=hora.Max)  # new op
    f = hora.allgather(np.full((1, 4), rank, np.float64), name=tag)  # new kind
    g = hora.broadcast(np.full(2, rank, np.int8), 0, name=tag)
    h = hora.broadcast(np.full(2, rank, np.int8), size - 1, name=tag)  # new root

    total = size * (size - 1) // 2
    assert_same(a, np.full(3, total, np.int32))
    assert_same(b, np.full(3, total, np.int32))
    assert_same(c, np.full(4, total, np.int32))
    assert_same(d, np.full(4, total, np.float64))
    assert_same(e, np.full(4, size - 1, np.float64))
    assert_same(f, np.repeat(np.arange(size, dtype=np.float64), 4).reshape(size, 4))
    assert_same(g, np.zeros(2, np.int8))
    assert_same(h, np.full(2, size - 1, np.int8))


def test_allgather_cached_then_first_dim_changes(rank, size):
    # The cached allgather remembers every rank's first dimension; when one
    # rank changes it, the result must follow.
    tag = "fusion.allgather_rows"
    results = []
    for step in range(3):
        rows = rank + 1 + (step if rank == size - 1 else 0)
        x = np.full((rows, 2), 10 * step + rank, np.int16)
        results.append(hora.allgather(x, name=tag))
    for step, result in enumerate(results):
        expected = np.concatenate([
            np.full((r + 1 + (step if r == size - 1 else 0), 2), 10 * step + r, np.int16)
            for r in range(size)])
        assert_same(result, expected)


def test_many_names_beyond_one_cycle(rank, size):
    # More names than fit in the default response cache's first word of
    # bits, cycled twice, with some reused names in between.
    tag = "fusion.cycle"
    rounds = []
    for _ in range(2):
        handles = [hora.allreduce_async(np.full(2, rank * (i + 1), np.int64),
                                        name=f"{tag}.{i}", op=hora.Sum) for i in range(150)]
        rounds.append([hora.synchronize(h) for h in handles])
    total = size * (size - 1) // 2
    for results in rounds:
        for i, result in enumerate(results):
            assert_same(result, np.full(2, total * (i + 1), np.int64))
