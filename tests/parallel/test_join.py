"""join(): ranks that run out of data early take part in the other ranks'
allreduces with neutral values until every rank has joined. As in Horovod
(and DDP), an Average still divides by size(); HORA_JOIN_AVERAGE=contributors
divides by the ranks that submitted instead."""

import os
import time

import numpy as np
import pytest

import hora
from conftest import rank_input
from hora_reference import assert_reduced, assert_same, inputs_of, reduce_reference

# (dtype, op) of the tensors each step submits together.
STEP_SPECS = [(np.float32, hora.Average), (np.float16, hora.Average), (np.int32, hora.Average),
              (np.int64, hora.Min), (np.float64, hora.Max), (np.int16, hora.Product),
              (np.bool_, hora.Min), (np.bool_, hora.Sum), (np.uint8, hora.Sum)]


def test_uneven_steps_then_join(rank, size):
    # Rank r runs r + 1 steps, so step i has contributions from ranks i..size-1.
    tag = "join.sum"
    results = []
    for i in range(rank + 1):
        x = rank_input(f"{tag}.{i}", rank, (4,), np.int32)
        results.append(hora.allreduce(x, name=f"{tag}.{i}", op=hora.Sum))
    last = hora.join()
    after = hora.allreduce(np.full(3, rank, np.int32), name=f"{tag}.after", op=hora.Sum)
    everyone_last = hora.allgather(np.array([last], np.int64), name=f"{tag}.last")

    for i, result in enumerate(results):
        contributors = range(i, size)
        expected = reduce_reference(inputs_of(f"{tag}.{i}", contributors, (4,), np.int32),
                                    hora.Sum, np.int32)
        assert_same(result, expected)
    # Rank size-1 cannot finish its last step before every other rank has
    # joined, so it is always the last to join.
    assert last == size - 1
    assert_same(everyone_last, np.full(size, last, np.int64))
    assert_same(after, np.full(3, size * (size - 1) // 2, np.int32))


def test_joined_ranks_are_neutral_for_every_op(rank, size):
    tag = "join.ops"
    steps = []
    for i in range(rank + 1):
        handles = []
        for k, (dtype, op) in enumerate(STEP_SPECS):
            x = rank_input(f"{tag}.{i}.{k}", rank, (5,), dtype)
            handles.append(hora.allreduce_async(x, name=f"{tag}.{i}.{k}", op=op))
        steps.append([hora.synchronize(h) for h in handles])
    last = hora.join()

    for i, results in enumerate(steps):
        contributors = range(i, size)
        for k, ((dtype, op), result) in enumerate(zip(STEP_SPECS, results)):
            everyone = inputs_of(f"{tag}.{i}.{k}", contributors, (5,), dtype)
            # Average divides by size(): the joined ranks count as zeros
            assert_reduced(result, reduce_reference(everyone, op, dtype, divisor=size), op)
    assert 0 <= last < size


def test_single_tensor_average_with_joined_ranks(rank, size):
    # A lone float32 tensor takes the direct (unfused) path on the ranks
    # that have it; the joined ranks still send zeros.
    tag = "join.lone"
    results = []
    for i in range(rank + 1):
        x = np.full(3, float(rank + 1), np.float32)
        results.append(hora.allreduce(x, name=f"{tag}.{i}", op=hora.Average,
                                      postscale_factor=2.0))
    hora.join()
    for i, result in enumerate(results):
        contributors = list(range(i, size))
        mean = sum(r + 1 for r in contributors) / size
        np.testing.assert_allclose(result, np.full(3, 2.0 * mean, np.float32), rtol=1e-6)


@pytest.fixture
def average_over_contributors():
    """hora re-initialized with HORA_JOIN_AVERAGE=contributors."""
    hora.shutdown()
    os.environ["HORA_JOIN_AVERAGE"] = "contributors"
    try:
        hora.init()
        yield
    finally:
        hora.shutdown()
        del os.environ["HORA_JOIN_AVERAGE"]
        hora.init()


def test_average_over_contributors_is_an_opt_in(rank, size, average_over_contributors):
    tag = "join.contributors"
    results = []
    for i in range(rank + 1):
        x = np.full(3, float(rank + 1), np.float32)
        results.append(hora.allreduce(x, name=f"{tag}.{i}", op=hora.Average))
    hora.join()
    for i, result in enumerate(results):
        contributors = list(range(i, size))
        mean = sum(r + 1 for r in contributors) / len(contributors)
        np.testing.assert_allclose(result, np.full(3, mean, np.float32), rtol=1e-6)


def test_join_without_work(rank, size):
    last = hora.join()
    again = hora.join()  # join can be used once per epoch, every epoch
    lasts = hora.allgather(np.array([last, again], np.int64), name="join.nowork.last")
    assert 0 <= last < size and 0 <= again < size
    assert_same(lasts, np.tile(np.array([last, again], np.int64), size))
    if size == 1:
        assert last == 0 and again == 0


def test_join_then_normal_collectives(rank, size):
    hora.join()
    x = rank_input("join.after", rank, (2, 3), np.float64)
    reduced = hora.allreduce(x, name="join.after.allreduce", op=hora.Sum)
    gathered = hora.allgather(x, name="join.after.allgather")
    broadcast = hora.broadcast(x, size - 1, name="join.after.broadcast")
    everyone = inputs_of("join.after", range(size), (2, 3), np.float64)
    assert_same(reduced, reduce_reference(everyone, hora.Sum, np.float64))
    assert_same(gathered, np.concatenate(everyone))
    assert_same(broadcast, everyone[size - 1])


def test_other_collectives_fail_while_a_rank_has_joined(rank, size):
    if size == 1:
        pytest.skip("needs a second rank to stay out of join()")
    # Deliberately different calls per rank: rank 0 joins at once, the
    # others try a broadcast, which only works when every rank takes part.
    error = None
    if rank == 0:
        last = hora.join()
    else:
        with pytest.raises(hora.HoraMismatchError) as error:
            hora.broadcast(np.zeros(2, np.float32), 1, name="join.broadcast")
        last = hora.join()
    after = hora.allreduce(np.ones(2, np.int32), name="join.broadcast.after", op=hora.Sum)
    assert 0 < last < size
    assert_same(after, np.full(2, size, np.int32))
    if error is not None:
        message = str(error.value)
        assert "join.broadcast" in message and "rank 0" in message and "join" in message


def test_cached_allreduce_while_a_rank_has_joined(rank, size):
    # Allreduce answered from the response cache on the ranks still
    # working; the joined rank takes part with neutral values.
    if size == 1:
        pytest.skip("needs a second rank to stay out of join()")
    name = "join.cached"
    warm = [hora.allreduce(np.full(2, rank + 1, np.int32), name=name, op=hora.Sum)
            for _ in range(2)]
    if rank == 0:
        hora.join()
        late = None
    else:
        late = hora.allreduce(np.full(2, rank + 1, np.int32), name=name, op=hora.Sum)
        hora.join()
    for result in warm:
        assert_same(result, np.full(2, size * (size + 1) // 2, np.int32))
    if late is not None:
        assert_same(late, np.full(2, size * (size + 1) // 2 - 1, np.int32))


def test_submitted_then_joined_rank_counts_as_contributor(rank, size):
    # Rank 0 submits its tensors and joins before the others submit theirs
    # (they wait half a second). Its tensors are real contributions, so the
    # Average must divide by every rank, the same as Sum / size.
    if size == 1:
        pytest.skip("needs a second rank")
    tag = "join.async_then_join"
    x = np.full(2, 10.0 * (rank + 1), np.float32)
    if rank == 0:
        average = hora.allreduce_async(x, name=tag + ".avg", op=hora.Average)
        total = hora.allreduce_async(x, name=tag + ".sum", op=hora.Sum)
        hora.join()
        average, total = hora.synchronize(average), hora.synchronize(total)
    else:
        time.sleep(0.5)
        average = hora.allreduce(x, name=tag + ".avg", op=hora.Average)
        total = hora.allreduce(x, name=tag + ".sum", op=hora.Sum)
        hora.join()
    expected_total = 10.0 * size * (size + 1) / 2
    assert_same(total, np.full(2, expected_total, np.float32))
    np.testing.assert_allclose(average, np.full(2, expected_total / size, np.float32),
                               rtol=1e-6)


def test_cached_broadcast_fails_while_a_rank_has_joined(rank, size):
    if size == 1:
        pytest.skip("needs a second rank to stay out of join()")
    name = "join.cached_broadcast"
    first = hora.broadcast(np.full(2, rank, np.float32), 1, name=name)  # now in the cache
    error = None
    if rank == 0:
        last = hora.join()
    else:
        with pytest.raises(hora.HoraMismatchError) as error:
            hora.broadcast(np.full(2, rank, np.float32), 1, name=name)
        last = hora.join()
    after = hora.allreduce(np.ones(2, np.int32), name=name + ".after", op=hora.Sum)
    assert_same(first, np.full(2, 1, np.float32))
    assert 0 < last < size
    assert_same(after, np.full(2, size, np.int32))
    if error is not None:
        assert "rank 0" in str(error.value)
