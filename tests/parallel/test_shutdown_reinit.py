"""shutdown() then init() again. Every test here leaves hora initialized, as
the session fixture in conftest.py expects."""

import os

import numpy as np
import pytest

import hora
from hora_reference import assert_same


@pytest.fixture
def restore_init():
    yield
    for variable in ("HORA_CACHE_CAPACITY", "HORA_CYCLE_TIME_MS", "HORA_FUSION_THRESHOLD_BYTES",
                     "HOROVOD_CACHE_CAPACITY"):
        os.environ.pop(variable, None)
    if not hora.is_initialized():
        hora.init()


def test_ops_after_shutdown_raise_then_init_works(restore_init, rank, size):
    hora.barrier()  # nothing of an earlier test is still in flight anywhere
    hora.shutdown()
    assert not hora.is_initialized()
    hora.shutdown()  # a second shutdown does nothing

    x = np.ones(3, np.float32)
    calls = {
        "allreduce": lambda: hora.allreduce(x, name="shutdown.allreduce", op=hora.Sum),
        "allreduce_": lambda: hora.allreduce_(x, name="shutdown.allreduce_", op=hora.Sum),
        "allreduce_async": lambda: hora.allreduce_async(x, name="shutdown.async"),
        "grouped_allreduce": lambda: hora.grouped_allreduce([x], name="shutdown.grouped"),
        "allgather": lambda: hora.allgather(x, name="shutdown.allgather"),
        "broadcast": lambda: hora.broadcast(x, 0, name="shutdown.broadcast"),
        "alltoall": lambda: hora.alltoall(x[:0], name="shutdown.alltoall"),
        "reducescatter": lambda: hora.reducescatter(x, name="shutdown.reducescatter"),
        "barrier": hora.barrier,
        "join": hora.join,
        "rank": hora.rank,
        "size": hora.size,
        "local_rank": hora.local_rank,
        "broadcast_object": lambda: hora.broadcast_object({"a": 1}),
        "allgather_object": lambda: hora.allgather_object(1),
    }
    outcomes = {}
    for what, call in calls.items():
        try:
            call()
            outcomes[what] = None
        except Exception as error:  # noqa: BLE001 - checked below
            outcomes[what] = error

    hora.init()
    assert hora.is_initialized()
    assert hora.rank() == rank and hora.size() == size
    reduced = hora.allreduce(np.full(3, rank, np.int64), name="shutdown.after", op=hora.Sum)
    gathered = hora.allgather(np.array([rank], np.int32), name="shutdown.after.allgather")

    for what, error in outcomes.items():
        assert isinstance(error, ValueError), f"{what} after shutdown raised {error!r}"
        assert "init" in str(error), f"{what}: {error}"
    assert_same(reduced, np.full(3, size * (size - 1) // 2, np.int64))
    assert_same(gathered, np.arange(size, dtype=np.int32))


def test_names_and_cache_start_fresh_after_reinit(restore_init, rank, size):
    # The same name before and after a restart, with different shapes: the
    # old engine's response cache must not leak into the new one.
    before = hora.allreduce(np.full(2, rank, np.int32), name="shutdown.fresh", op=hora.Sum)
    again = hora.allreduce(np.full(2, rank, np.int32), name="shutdown.fresh", op=hora.Sum)
    hora.barrier()
    hora.shutdown()
    hora.init()
    after = hora.allreduce(np.full(5, rank, np.float64), name="shutdown.fresh", op=hora.Max)
    unnamed = hora.allreduce(np.full(2, rank, np.int32), op=hora.Sum)
    total = size * (size - 1) // 2
    assert_same(before, np.full(2, total, np.int32))
    assert_same(again, np.full(2, total, np.int32))
    assert_same(after, np.full(5, size - 1, np.float64))
    assert_same(unnamed, np.full(2, total, np.int32))


def test_init_with_a_list_of_every_rank(restore_init, rank, size):
    hora.barrier()
    hora.shutdown()
    hora.init(comm=list(range(size)))
    assert hora.rank() == rank and hora.size() == size
    result = hora.allreduce(np.ones(2, np.int32), name="shutdown.comm_list", op=hora.Sum)
    assert_same(result, np.full(2, size, np.int32))


def test_init_with_a_subset_of_ranks(restore_init, rank, size):
    # Only the listed ranks call init; the last rank stays out of it.
    if size == 1:
        pytest.skip("needs a rank to leave out")
    hora.barrier()
    hora.shutdown()
    members = list(range(size - 1))
    outcome = None
    if rank in members:
        try:
            hora.init(comm=members)
            outcome = (hora.rank(), hora.size(),
                       hora.allreduce(np.full(2, rank + 1, np.int32), name="shutdown.subset",
                                      op=hora.Sum))
        except Exception as error:  # noqa: BLE001 - checked below
            outcome = error
        hora.shutdown()
    hora.init()  # everyone again
    after = hora.allreduce(np.ones(1, np.int32), name="shutdown.subset.after", op=hora.Sum)
    assert_same(after, np.full(1, size, np.int32))
    if rank in members:
        assert isinstance(outcome, tuple), f"init(comm={members}) failed: {outcome!r}"
        sub_rank, sub_size, reduced = outcome
        assert sub_rank == rank and sub_size == size - 1
        assert_same(reduced, np.full(2, (size - 1) * size // 2, np.int32))


def test_init_with_mpi4py_communicators(restore_init, rank, size):
    MPI = pytest.importorskip("mpi4py.MPI")
    hora.barrier()
    hora.shutdown()
    hora.init(comm=MPI.COMM_WORLD)
    world = (hora.rank(), hora.size(),
             hora.allreduce(np.ones(1, np.int32), name="shutdown.mpi4py.world", op=hora.Sum))
    hora.shutdown()
    # Two independent jobs: even and odd world ranks.
    halves = MPI.COMM_WORLD.Split(color=rank % 2, key=rank)
    hora.init(comm=halves)
    half = (hora.rank(), hora.size(),
            hora.allgather(np.array([rank], np.int64), name="shutdown.mpi4py.half"))
    hora.shutdown()
    halves.Free()
    hora.init()

    assert world[0] == MPI.COMM_WORLD.Get_rank() == rank and world[1] == size
    assert_same(world[2], np.full(1, size, np.int32))
    mine = [r for r in range(size) if r % 2 == rank % 2]
    assert half[0] == mine.index(rank) and half[1] == len(mine)
    assert_same(half[2], np.array(mine, np.int64))


def test_bad_setting_fails_init_and_leaves_it_retryable(restore_init, rank, size):
    hora.barrier()
    hora.shutdown()
    os.environ["HORA_CACHE_CAPACITY"] = "lots"
    try:
        with pytest.raises(ValueError, match="HORA_CACHE_CAPACITY"):
            hora.init()
        assert not hora.is_initialized()
    finally:
        del os.environ["HORA_CACHE_CAPACITY"]
    # settings are read at init: a restart with a tiny cache and a cycle time
    os.environ["HORA_CACHE_CAPACITY"] = "2"
    os.environ["HORA_CYCLE_TIME_MS"] = "1"
    hora.init()
    handles = [hora.allreduce_async(np.full(2, rank + i, np.int32), name=f"shutdown.small.{i}",
                                    op=hora.Sum) for i in range(10)]
    first = [hora.synchronize(h) for h in handles]
    handles = [hora.allreduce_async(np.full(2, rank + i, np.int32), name=f"shutdown.small.{i}",
                                    op=hora.Sum) for i in range(10)]
    second = [hora.synchronize(h) for h in handles]
    hora.barrier()
    hora.shutdown()
    del os.environ["HORA_CACHE_CAPACITY"], os.environ["HORA_CYCLE_TIME_MS"]
    hora.init()
    total = size * (size - 1) // 2
    for results in (first, second):
        for i, result in enumerate(results):
            assert_same(result, np.full(2, total + size * i, np.int32))


@pytest.mark.parametrize("variable,value,expected", [
    ("HORA_SHARED_GPU", "sometimes", "auto, stage or error"),
    ("HORA_JOIN_AVERAGE", "median", "size or contributors"),
])
def test_bad_choice_names_the_variable_and_the_choices(restore_init, variable, value, expected):
    hora.barrier()
    hora.shutdown()
    os.environ[variable] = value
    try:
        with pytest.raises(ValueError, match=variable) as raised:
            hora.init()
        assert value in str(raised.value) and expected in str(raised.value), raised.value
    finally:
        del os.environ[variable]


def run_mixed_batch(tag, rank):
    """40 allreduces of mixed sizes and dtypes in flight together."""
    handles = []
    for i in range(40):
        dtype = (np.float32, np.float16, np.int64, np.float64)[i % 4]
        x = np.full(i % 13 + 1, rank + i % 5, dtype)
        handles.append(hora.allreduce_async(x, name=f"{tag}.{i}", op=hora.Sum))
    return [hora.synchronize(h) for h in handles]


def check_mixed_batch(results, size):
    for i, result in enumerate(results):
        dtype = (np.float32, np.float16, np.int64, np.float64)[i % 4]
        assert_same(result, np.full(i % 13 + 1, size * (i % 5) + size * (size - 1) // 2, dtype))


@pytest.mark.parametrize("settings", [
    {"HORA_FUSION_THRESHOLD_BYTES": "64"},
    {"HORA_FUSION_THRESHOLD_BYTES": "0", "HORA_CACHE_CAPACITY": "0"},
    {"HORA_CACHE_CAPACITY": "1", "HORA_CYCLE_TIME_MS": "5"},
], ids=["threshold64", "no_fusion_no_cache", "cache1_cycle5"])
def test_engine_settings(restore_init, settings, rank, size):
    hora.barrier()
    hora.shutdown()
    os.environ.update(settings)
    try:
        hora.init()
        first = run_mixed_batch("shutdown.settings", rank)
        second = run_mixed_batch("shutdown.settings", rank)
        hora.barrier()
        hora.shutdown()
    finally:
        for variable in settings:
            del os.environ[variable]
    hora.init()
    check_mixed_batch(first, size)
    check_mixed_batch(second, size)


def test_horovod_setting_names_are_read(restore_init, rank, size):
    hora.barrier()
    hora.shutdown()
    os.environ["HOROVOD_CACHE_CAPACITY"] = "-3"
    try:
        with pytest.raises(ValueError, match="HOROVOD_CACHE_CAPACITY"):
            hora.init()
    finally:
        del os.environ["HOROVOD_CACHE_CAPACITY"]
    hora.init()
    assert hora.is_initialized()
