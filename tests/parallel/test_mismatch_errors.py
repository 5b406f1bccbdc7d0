"""Ranks that disagree about a collective all get HoraMismatchError, quickly,
with a message naming the tensor, the ranks and their values; the process
stays usable afterwards.

Each test calls the collective on every rank with rank-dependent
parameters, catches whatever comes back (so every rank goes on to make the
same calls even if one rank wrongly succeeds), runs a good collective, and
only then asserts.
"""

import time

import numpy as np
import pytest

import hora
from hora_reference import assert_same

# A mismatch is decided in the next negotiation cycle; allow for a slow,
# oversubscribed machine but fail long before anything that looks like a hang.
MAX_SECONDS = 5.0


@pytest.fixture(autouse=True)
def needs_two_ranks(size):
    if size == 1:
        pytest.skip("a mismatch needs at least two ranks")


def attempt(call):
    """Runs ``call`` and returns (exception or None, seconds taken)."""
    start = time.monotonic()
    try:
        call()
    except Exception as error:  # noqa: BLE001 - checked by the caller
        return error, time.monotonic() - start
    return None, time.monotonic() - start


def still_usable(name, size):
    """A good collective after the failure; returns a checker for the end."""
    result = hora.allreduce(np.ones(3, np.int32), name=name, op=hora.Sum)
    return lambda: assert_same(result, np.full(3, size, np.int32))


def check_mismatch(error, seconds, name, *fragments):
    assert isinstance(error, hora.HoraMismatchError), f"expected HoraMismatchError, got {error!r}"
    assert isinstance(error, hora.HoraError) and isinstance(error, RuntimeError)
    message = str(error)
    assert f"'{name}'" in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert seconds < MAX_SECONDS, f"the mismatch took {seconds:.1f}s to be reported"


def every_rank_named(size):
    """Fragments naming each rank alone (every rank sent its own value)."""
    return [f"rank {r} sent" for r in range(size)]


def test_shape_mismatch(rank, size):
    name = "mismatch.shape"
    error, seconds = attempt(lambda: hora.allreduce(np.zeros(3 + rank, np.float32), name=name))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "shape", "rank 0 sent [3]", "rank 1 sent [4]",
                   *every_rank_named(size))
    usable()


def test_dtype_mismatch(rank, size):
    name = "mismatch.dtype"
    dtype = [np.float32, np.float64, np.int32][rank % 3]
    error, seconds = attempt(lambda: hora.allreduce(np.zeros(4, dtype), name=name, op=hora.Sum))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "data type", "float32", "float64",
                   *every_rank_named(size))
    usable()


def test_op_mismatch(rank, size):
    name = "mismatch.op"
    op = [hora.Sum, hora.Max, hora.Min][rank % 3]
    error, seconds = attempt(lambda: hora.allreduce(np.zeros(4, np.float32), name=name, op=op))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "reduce op", "Sum", "Max", *every_rank_named(size))
    usable()


def test_root_rank_mismatch(rank, size):
    name = "mismatch.root"
    error, seconds = attempt(lambda: hora.broadcast(np.zeros(2, np.int64), rank, name=name))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "root rank", "broadcast", *every_rank_named(size))
    usable()


def test_prescale_mismatch(rank, size):
    name = "mismatch.prescale"
    error, seconds = attempt(lambda: hora.allreduce(
        np.ones(2, np.float32), name=name, op=hora.Sum, prescale_factor=1.0 + rank))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "prescale", *every_rank_named(size))
    usable()


def test_postscale_mismatch(rank, size):
    name = "mismatch.postscale"
    error, seconds = attempt(lambda: hora.allreduce(
        np.ones(2, np.float64), name=name, op=hora.Sum, postscale_factor=0.5 * (rank + 1)))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "postscale", *every_rank_named(size))
    usable()


def test_collective_kind_mismatch(rank, size):
    # Rank 0 calls allreduce 'k' while the others call allgather 'k'.
    name = "mismatch.kind"
    x = np.zeros((2,), np.float32)
    if rank == 0:
        error, seconds = attempt(lambda: hora.allreduce(x, name=name, op=hora.Sum))
    else:
        error, seconds = attempt(lambda: hora.allgather(x, name=name))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "kind", "allreduce", "allgather", "rank 0 sent")
    usable()


def test_allgather_trailing_shape_mismatch(rank, size):
    name = "mismatch.allgather"
    error, seconds = attempt(lambda: hora.allgather(np.zeros((2, 3 + rank), np.int8), name=name))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "shape", *every_rank_named(size))
    usable()


def test_allgather_rank_count_mismatch(rank, size):
    name = "mismatch.allgather_ndim"
    shape = (2, 3) if rank == 0 else (2, 3, 1)
    error, seconds = attempt(lambda: hora.allgather(np.zeros(shape, np.int8), name=name))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "shape", "rank 0 sent")
    usable()


def test_reducescatter_shape_mismatch(rank, size):
    name = "mismatch.reducescatter"
    error, seconds = attempt(lambda: hora.reducescatter(
        np.zeros((size + rank, 2), np.float32), name=name, op=hora.Sum))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "shape", *every_rank_named(size))
    usable()


def test_alltoall_dtype_mismatch(rank, size):
    name = "mismatch.alltoall"
    dtype = [np.int16, np.int32, np.int64][rank % 3]
    error, seconds = attempt(lambda: hora.alltoall(np.zeros(size, dtype), name=name))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "data type", "int16", "int32", *every_rank_named(size))
    usable()


def test_broadcast_shape_mismatch(rank, size):
    name = "mismatch.broadcast"
    error, seconds = attempt(lambda: hora.broadcast(np.zeros((rank + 1, 2), np.float64), 0,
                                                    name=name))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, name, "shape", *every_rank_named(size))
    usable()


def test_one_rank_differs(rank, size):
    # Ranks that agree are listed together: "ranks 0, 2 sent [3]; rank 1 sent [4]".
    name = "mismatch.one_rank"
    length = 4 if rank == 1 else 3
    error, seconds = attempt(lambda: hora.allreduce(np.zeros(length, np.float32), name=name))
    usable = still_usable(name + ".after", size)
    agreeing = "rank 0 sent [3]" if size == 2 else "ranks 0, 2 sent [3]"
    check_mismatch(error, seconds, name, "rank 1 sent [4]", agreeing)
    usable()


def test_failed_async_handle_polls_done_then_raises(rank, size):
    name = "mismatch.async"
    handle = hora.allreduce_async(np.zeros(2 + rank, np.float32), name=name)
    deadline = time.monotonic() + MAX_SECONDS
    while not hora.poll(handle) and time.monotonic() < deadline:
        time.sleep(0.001)
    polled = hora.poll(handle)
    error, seconds = attempt(lambda: hora.synchronize(handle))
    usable = still_usable(name + ".after", size)
    assert polled, "poll() did not report the failed collective as done"
    check_mismatch(error, 0.0, name, "shape", *every_rank_named(size))
    usable()


def test_same_name_works_after_mismatch(rank, size):
    name = "mismatch.reuse"
    error, seconds = attempt(lambda: hora.allreduce(np.zeros(2 + rank, np.int32), name=name))
    good = hora.allreduce(np.full(5, rank, np.int32), name=name, op=hora.Sum)
    check_mismatch(error, seconds, name, "shape")
    assert_same(good, np.full(5, size * (size - 1) // 2, np.int32))


def test_mismatch_after_cache_hit(rank, size):
    # The name is in the response cache after two good rounds; a third
    # round with a rank-dependent shape must still be caught.
    name = "mismatch.cached"
    first = hora.allreduce(np.full(3, rank, np.int32), name=name, op=hora.Sum)
    second = hora.allreduce(np.full(3, rank, np.int32), name=name, op=hora.Sum)
    shape = 3 if rank == 0 else 3 + rank
    error, seconds = attempt(lambda: hora.allreduce(np.zeros(shape, np.int32), name=name,
                                                    op=hora.Sum))
    third = hora.allreduce(np.full(3, rank, np.int32), name=name, op=hora.Sum)
    total = size * (size - 1) // 2
    assert_same(first, np.full(3, total, np.int32))
    assert_same(second, np.full(3, total, np.int32))
    check_mismatch(error, seconds, name, "shape", *every_rank_named(size))
    assert_same(third, np.full(3, total, np.int32))


def test_op_mismatch_after_cache_hit(rank, size):
    name = "mismatch.cached_op"
    first = hora.allreduce(np.full(2, rank, np.float32), name=name, op=hora.Max)
    second = hora.allreduce(np.full(2, rank, np.float32), name=name, op=hora.Max)
    op = hora.Max if rank == 0 else hora.Min
    error, seconds = attempt(lambda: hora.allreduce(np.full(2, rank, np.float32), name=name,
                                                    op=op))
    usable = still_usable(name + ".after", size)
    assert_same(first, np.full(2, size - 1, np.float32))
    assert_same(second, np.full(2, size - 1, np.float32))
    check_mismatch(error, seconds, name, "reduce op", "Max", "Min", "rank 0 sent")
    usable()


def test_one_bad_tensor_among_many_in_flight(rank, size):
    # Only the mismatched tensor fails; the ones around it (which would be
    # fused with it) still give the right result.
    tag = "mismatch.in_flight"
    handles = []
    for i in range(10):
        length = 3 + (rank if i == 4 else 0)
        handles.append(hora.allreduce_async(np.full(length, i + rank, np.float32),
                                            name=f"{tag}.{i}", op=hora.Sum))
    outcomes = []
    for handle in handles:
        error, seconds = attempt(lambda handle=handle: outcomes.append(hora.synchronize(handle)))
        if error is not None:
            outcomes.append((error, seconds))
    usable = still_usable(tag + ".after", size)
    for i, outcome in enumerate(outcomes):
        if i == 4:
            assert isinstance(outcome, tuple), f"tensor 4 did not fail: {outcome!r}"
            check_mismatch(*outcome, f"{tag}.4", "shape", *every_rank_named(size))
        else:
            assert_same(outcome, np.full(3, size * i + size * (size - 1) // 2, np.float32))
    usable()


def test_grouped_member_mismatch(rank, size):
    name = "mismatch.grouped"
    tensors = [np.ones(2, np.float32), np.ones(3 + rank, np.float32)]
    error, seconds = attempt(lambda: hora.grouped_allreduce(tensors, name=name, op=hora.Sum))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, f"{name}.1", "shape", *every_rank_named(size))
    usable()


def test_grouped_against_ungrouped(rank, size):
    # Rank 0 submits 'mismatch.group.0' as the only member of a group, the
    # others submit it on its own.
    name = "mismatch.group"
    tensor = np.ones(2, np.float32)
    if rank == 0:
        error, seconds = attempt(lambda: hora.grouped_allreduce([tensor], name=name, op=hora.Sum))
    else:
        error, seconds = attempt(lambda: hora.allreduce(tensor, name=f"{name}.0", op=hora.Sum))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, f"{name}.0", "group", "rank 0 sent")
    usable()


def test_grouped_member_count_mismatch(rank, size):
    name = "mismatch.group_size"
    tensors = [np.ones(2, np.float32)] * (2 if rank == 0 else 3)
    error, seconds = attempt(lambda: hora.grouped_allreduce(tensors, name=name, op=hora.Sum))
    usable = still_usable(name + ".after", size)
    assert isinstance(error, hora.HoraMismatchError), f"expected HoraMismatchError, got {error!r}"
    assert seconds < MAX_SECONDS
    usable()


def test_grouped_member_count_mismatch_with_a_late_rank(rank, size):
    # The last rank submits well after the others, which already disagree
    # among themselves (at 3+ ranks): the error must wait for its members
    # too, or they would never be answered.
    name = "mismatch.group_size_late"
    tensors = [np.ones(2, np.float32)] * (2 if rank == 0 else 3)
    if rank == size - 1:
        time.sleep(0.5)
    error, seconds = attempt(lambda: hora.grouped_allreduce(tensors, name=name, op=hora.Sum))
    usable = still_usable(name + ".after", size)
    assert isinstance(error, hora.HoraMismatchError), f"expected HoraMismatchError, got {error!r}"
    assert "Mismatched number of tensors" in str(error), str(error)
    assert "rank 0 sent 2" in str(error), str(error)
    assert seconds < MAX_SECONDS
    usable()


def test_grouped_member_count_mismatch_after_cache_hits(rank, size):
    # The group is answered by the response cache once it has run; a rank
    # that then sends fewer members must still meet an error, not a hang.
    name = "mismatch.cached_group"
    for _ in range(3):
        out = hora.grouped_allreduce([np.ones(2, np.float32)] * 3, name=name, op=hora.Sum)
        assert_same(out[2], np.full(2, size, np.float32))
    if size == 1:
        return
    tensors = [np.ones(2, np.float32)] * (2 if rank == 0 else 3)
    error, seconds = attempt(lambda: hora.grouped_allreduce(tensors, name=name, op=hora.Sum))
    usable = still_usable(name + ".after", size)
    assert isinstance(error, hora.HoraMismatchError), f"expected HoraMismatchError, got {error!r}"
    assert seconds < MAX_SECONDS
    out = hora.grouped_allreduce([np.ones(2, np.float32)] * 3, name=name, op=hora.Sum)
    assert_same(out[0], np.full(2, size, np.float32))
    usable()


def test_grouped_dtype_change_after_cache_hits(rank, size):
    name = "mismatch.cached_group_dtype"
    for _ in range(2):
        hora.grouped_allreduce([np.ones(2, np.float32), np.ones(3, np.float32)], name=name,
                               op=hora.Sum)
    if size == 1:
        return
    second = np.ones(3, np.float64 if rank == size - 1 else np.float32)
    error, seconds = attempt(lambda: hora.grouped_allreduce([np.ones(2, np.float32), second],
                                                            name=name, op=hora.Sum))
    usable = still_usable(name + ".after", size)
    check_mismatch(error, seconds, f"{name}.1", "data type")
    usable()
