"""Process sets through the NumPy face: every collective inside static and
dynamic sets against references, sets working side by side with tensors of
the same name, the set's own Average divisor and roots, Adasum inside a
power-of-two set, and the errors (non-members, bad or duplicate ranks,
ranks that disagree, removing the global set), raised on every rank."""

import os
import threading

import numpy as np
import pytest
from conftest import rank_input
from parity_sets import parity_fixture

import hora


sets = pytest.fixture(parity_fixture, name="sets")


@pytest.fixture
def two_or_more(size):
    if size == 1:
        pytest.skip("on one rank every set is the global set")


def test_process_set_objects(rank, size, sets):
    evens, odds, mine = sets
    assert evens.ranks == list(range(0, size, 2))
    assert mine.included() and mine.size() == len(mine.ranks)
    assert mine.rank() == mine.ranks.index(rank)
    assert hora.global_process_set.ranks == list(range(size))
    assert hora.global_process_set.size() == size
    assert (evens == hora.global_process_set) == (size == 1) and evens == evens
    assert hora.ProcessSet([2, 0]) == hora.ProcessSet([0, 2])
    assert "ranks=[0" in repr(evens) and f"process_set_id={evens.process_set_id}" in repr(evens)
    if odds is not None:
        other = odds if mine is evens else evens
        assert other.included() is False
        with pytest.raises(ValueError, match="not part of"):
            other.rank()


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_allreduce_in_sets(rank, size, sets, dtype):
    _, _, mine = sets
    inputs = {r: rank_input("ps.allreduce", r, (5, 3), dtype) for r in mine.ranks}
    total = sum(inputs[r].astype(np.float64) for r in mine.ranks)
    got = hora.allreduce(inputs[rank], name="ps.same.name", op=hora.Sum, process_set=mine)
    np.testing.assert_array_equal(got, total.astype(dtype))
    if np.issubdtype(dtype, np.floating):
        avg = hora.allreduce(inputs[rank], name="ps.avg", process_set=mine)
        np.testing.assert_allclose(avg, total / len(mine.ranks), rtol=1e-6)
    # the same name on the global set is a different collective
    everyone = sum(rank_input("ps.allreduce", r, (5, 3), dtype).astype(np.float64)
                   for r in range(size))
    got = hora.allreduce(inputs[rank], name="ps.same.name", op=hora.Sum)
    np.testing.assert_array_equal(got, everyone.astype(dtype))


def test_async_grouped_and_in_place(rank, sets):
    _, _, mine = sets
    xs = [np.full(4, float(rank + k)) for k in range(3)]
    handle = hora.grouped_allreduce_async(xs, op=hora.Sum, process_set=mine)
    in_place = np.full(7, float(rank))
    hora.allreduce_(in_place, op=hora.Max, process_set=mine)
    got = hora.synchronize(handle)
    for k, g in enumerate(got):
        np.testing.assert_array_equal(g, np.full(4, float(sum(r + k for r in mine.ranks))))
    np.testing.assert_array_equal(in_place, np.full(7, float(max(mine.ranks))))
    ys = [np.full(2, 1.0), np.full(3, 2.0)]
    hora.grouped_allreduce_(ys, op=hora.Sum, process_set=mine)
    np.testing.assert_array_equal(ys[1], np.full(3, 2.0 * len(mine.ranks)))


def test_allgather_broadcast_alltoall_reducescatter(rank, sets):
    _, _, mine = sets
    n, me = len(mine.ranks), mine.rank()
    gathered = hora.allgather(np.full((me + 1, 2), rank), process_set=mine)
    want = np.concatenate([np.full((k + 1, 2), r) for k, r in enumerate(mine.ranks)])
    np.testing.assert_array_equal(gathered, want)
    root = mine.ranks[-1]  # a global rank
    got = hora.broadcast(np.full(3, rank), root_rank=root, process_set=mine)
    np.testing.assert_array_equal(got, np.full(3, root))
    send = np.arange(n * 2).reshape(n * 2, 1) + 100 * rank
    received, splits = hora.alltoall(send, splits=[2] * n, process_set=mine)
    assert list(splits) == [2] * n
    want = np.concatenate([np.arange(2 * me, 2 * me + 2).reshape(2, 1) + 100 * r
                           for r in mine.ranks])
    np.testing.assert_array_equal(received, want)
    block = hora.reducescatter(np.ones((2 * n, 3)), op=hora.Sum, process_set=mine)
    np.testing.assert_array_equal(block, np.full((2, 3), float(n)))


def test_barrier_and_objects(rank, sets):
    _, _, mine = sets
    hora.barrier(process_set=mine)
    assert hora.allgather_object({"r": rank}, process_set=mine) == [{"r": r} for r in mine.ranks]
    root = mine.ranks[0]
    assert hora.broadcast_object(("from", rank), root_rank=root,
                                 process_set=mine) == ("from", root)


def test_root_outside_the_set_is_refused(rank, size, sets):
    _, odds, mine = sets
    if odds is None:
        pytest.skip("needs two sets")
    outsider = next(r for r in range(size) if r not in mine.ranks)
    with pytest.raises(ValueError, match=f"root rank {outsider} is not in process set"):
        hora.broadcast(np.zeros(2), root_rank=outsider, name="ps.bad.root", process_set=mine)


def test_non_member_is_refused(rank, size, sets):
    evens, odds, mine = sets
    if odds is None:
        pytest.skip("needs two sets")
    other = odds if mine is evens else evens
    ranks = ", ".join(map(str, other.ranks))
    with pytest.raises(ValueError, match=rf"rank {rank}\) is not in process set "
                                         rf"{other.process_set_id} \(ranks? {ranks}\)"):
        hora.allreduce(np.zeros(2), name="ps.outsider", process_set=other)


def test_sets_run_side_by_side(rank, size, sets):
    """Each set runs many collectives of the same names from two threads
    while the other set does the same; nothing waits on the other set."""
    _, _, mine = sets
    errors = []

    def work(thread):
        try:
            for step in range(30):
                x = np.full(257, float(rank * 1000 + step))
                got = hora.allreduce(x, name=f"ps.side.{thread}", op=hora.Sum, process_set=mine)
                want = float(sum(r * 1000 + step for r in mine.ranks))
                assert got[0] == want and got[-1] == want
        except Exception as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for t in threads:
        t.start()
    big = hora.allreduce(np.ones(1 << 18, np.float32), name="ps.side.global", op=hora.Sum)
    for t in threads:
        t.join()
    assert not errors, errors
    assert big[0] == size


def test_adasum_in_a_power_of_two_set(rank, size, two_or_more):
    """A 3-rank job cannot use Adasum on the global set, but can inside a
    set of two."""
    pair = hora.add_process_set([0, 1] if size > 2 else [0])
    try:
        if rank in pair.ranks:
            a = np.array([1.0, 0.0]) if rank == 0 else np.array([0.0, 1.0])
            got = hora.allreduce(a, name="ps.adasum", op=hora.Adasum, process_set=pair)
            # orthogonal vectors add up
            want = np.array([1.0, 1.0]) if len(pair.ranks) == 2 else a
            np.testing.assert_allclose(got, want)
    finally:
        hora.barrier()
        hora.remove_process_set(pair)


def test_dynamic_sets_are_added_and_removed(rank, size, two_or_more):
    first = hora.add_process_set([0])
    second = hora.add_process_set(range(1, size))
    assert first.process_set_id > 0
    ids = {first.process_set_id} | ({second.process_set_id} if second else set())
    assert len(ids) == (2 if second else 1)
    if rank == 0:
        assert hora.allreduce(np.ones(1), op=hora.Sum, process_set=first)[0] == 1
    assert hora.remove_process_set(first) is True
    assert first.process_set_id is None
    assert hora.remove_process_set(first) is False  # as Horovod: nothing to remove
    with pytest.raises(hora.HoraInvalidArgumentError, match="is not registered"):
        hora.allreduce(np.ones(1), process_set=first)
    with pytest.raises(hora.HoraTypeError, match="must be one of hora's process sets"):
        hora.allreduce(np.ones(1), process_set="evens")
    if second is not None:
        hora.remove_process_set(second)
    again = hora.add_process_set([0])  # the same ranks may come back
    assert again.process_set_id not in ids
    hora.remove_process_set(again)


def test_set_errors_on_every_rank(rank, size):
    with pytest.raises(ValueError, match="listed more than once"):
        hora.ProcessSet([0, 0])
    with pytest.raises(ValueError, match=f"rank {size} is outside the job's ranks"):
        hora.add_process_set([0, size])
    with pytest.raises(ValueError, match="global process set cannot be removed"):
        hora.remove_process_set(hora.global_process_set)
    with pytest.raises(ValueError, match="same ranks"):
        hora.add_process_set(range(size))  # the global set's ranks
    ps = hora.add_process_set([0]) if size > 1 else hora.global_process_set
    try:
        with pytest.raises(ValueError, match="same ranks; a set may exist only once"):
            hora.add_process_set([0])
    finally:
        if size > 1:
            hora.remove_process_set(ps)
    # the job is still fine
    assert hora.allreduce(np.ones(1), op=hora.Sum, name="ps.after.errors")[0] == size


def test_ranks_that_disagree(rank, size):
    if size == 1:
        pytest.skip("a disagreement needs two ranks")
    with pytest.raises(hora.HoraMismatchError, match=r"Mismatched ranks for add_process_set") \
            as error:
        hora.add_process_set([rank])
    assert "rank 0" in str(error.value) and "rank 1" in str(error.value)
    assert hora.allreduce(np.ones(1), op=hora.Sum, name="ps.after.mismatch")[0] == size


def test_pending_collective_fails_when_its_set_is_removed(rank, size):
    if size < 3:
        pytest.skip("needs a set of two ranks that is not the whole job")
    pair = hora.add_process_set([0, 1])
    handle = None
    if rank == 0:  # rank 1 never submits: the allreduce waits
        handle = hora.allreduce_async(np.ones(2), name="ps.orphan", process_set=pair)
    hora.barrier()
    hora.remove_process_set(pair)
    if handle is not None:
        with pytest.raises(hora.HoraShutdownError,
                           match=r"\(ranks 0, 1\) was removed, or hora was shut down, while"):
            hora.synchronize(handle)


def test_add_needs_dynamic_sets(restart_hora, rank, size):
    restart_hora(HORA_DYNAMIC_PROCESS_SETS="0")
    hora.shutdown()
    hora.init()
    try:
        with pytest.raises(ValueError, match="needs dynamic process sets"):
            hora.add_process_set([0])
    finally:
        hora.shutdown()
        hora.init(process_sets="dynamic")


def test_static_sets_at_init(rank, size, monkeypatch):
    monkeypatch.setenv("HORA_DYNAMIC_PROCESS_SETS", "0")
    hora.barrier()
    hora.shutdown()
    evens = hora.ProcessSet(range(0, size, 2))
    pair = hora.ProcessSet([0, 1]) if size > 2 else None
    static = [evens] if size > 1 else []
    static += [pair] if pair else []
    hora.init(process_sets=static)
    try:
        assert size == 1 or evens.process_set_id == 1
        assert pair is None or pair.process_set_id == 2
        if size > 1 and evens.included():
            got = hora.allreduce(np.full(2, float(rank)), op=hora.Sum, process_set=evens)
            assert got[0] == sum(evens.ranks)
        if pair is not None and pair.included():
            assert hora.allgather(np.array([rank]), process_set=pair).tolist() == [0, 1]
        with pytest.raises(ValueError, match="needs dynamic process sets"):
            hora.add_process_set([0])
    finally:
        hora.barrier()
        hora.shutdown()
        monkeypatch.undo()
        hora.init(process_sets="dynamic")


def test_static_sets_that_differ_between_ranks(rank, size):
    if size == 1:
        pytest.skip("a disagreement needs two ranks")
    hora.barrier()
    hora.shutdown()
    try:
        with pytest.raises(hora.HoraMismatchError, match="Mismatched ranks for add_process_set"):
            hora.init(process_sets=[hora.ProcessSet([rank])])
    finally:
        hora.shutdown()
        hora.init(process_sets="dynamic")


def test_static_set_outside_the_job_names_the_rank(size):
    hora.barrier()
    hora.shutdown()
    try:
        # As many ranks as the job, but not the job's: not the global set.
        ranks = list(range(size - 1)) + [size + 3]
        with pytest.raises(ValueError, match=rf"rank {size + 3} is outside the job's ranks "
                                             rf"0\.\.{size - 1}"):
            hora.init(process_sets=[hora.ProcessSet(ranks)])
    finally:
        hora.shutdown()
        hora.init(process_sets="dynamic")


def test_sets_from_mpi_communicators(rank, size, two_or_more):
    mpi4py = pytest.importorskip("mpi4py.MPI")
    if os.environ.get("HORA_TEST_FAKE_HOSTS", "0") != "0":
        pytest.skip("one communicator layout is enough")
    comm = mpi4py.COMM_WORLD.Split(color=rank % 2, key=rank)
    hora.barrier()
    hora.shutdown()
    mine = hora.ProcessSet(comm)
    try:
        hora.init(process_sets=[mine])
        assert mine.ranks == list(range(rank % 2, size, 2))
        got = hora.allreduce(np.array([float(rank)]), op=hora.Sum, process_set=mine)
        assert got[0] == sum(mine.ranks)
    finally:
        hora.barrier()
        hora.shutdown()
        comm.Free()
        hora.init(process_sets="dynamic")


def test_timeline_rows_name_the_set(tmp_path, rank, size, sets):
    import json
    evens, _, mine = sets
    path = tmp_path / "timeline.json"
    hora.start_timeline(path)
    hora.barrier()
    hora.allreduce(np.ones(3), name="ps.tl", op=hora.Sum, process_set=mine)
    hora.allreduce(np.ones(3), name="ps.tl", op=hora.Sum)
    hora.barrier()
    hora.stop_timeline()
    hora.barrier()
    if rank != 0:
        return
    rows = {e["args"]["name"] for e in json.loads(path.read_text())
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    assert "ps.tl" in rows
    if evens is not hora.global_process_set:  # rank 0 is in the evens
        assert f"ps.tl [process set {evens.process_set_id}]" in rows, rows


def test_mismatch_inside_a_set_names_job_ranks(rank, size):
    if size < 3:
        pytest.skip("needs a set that does not start at rank 0")
    pair = hora.add_process_set([1, 2])
    try:
        if rank in pair.ranks:
            with pytest.raises(hora.HoraMismatchError) as error:
                hora.allreduce(np.zeros(rank + 1), name="ps.mismatch", process_set=pair)
            message = str(error.value)
            assert f"in process set {pair.process_set_id} (ranks 1, 2)" in message, message
            assert "rank 1 sent [2]" in message and "rank 2 sent [3]" in message, message
            # the set is still usable
            got = hora.allreduce(np.ones(1), name="ps.after", op=hora.Sum, process_set=pair)
            assert got[0] == 2
    finally:
        hora.barrier()
        hora.remove_process_set(pair)
