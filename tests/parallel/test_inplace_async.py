"""In-place variants write into the caller's array; async variants return
handles that poll and synchronize."""

import time

import numpy as np
import pytest

import hora
from conftest import rank_input
from hora_reference import (assert_reduced, assert_same, dtype_name, inputs_of, is_bool,
                            reduce_reference, reducescatter_block)

INPLACE_DTYPES = [np.uint8, np.int32, np.int64, np.float16, "bfloat16", np.float32, np.bool_]


def wait_until_done(handle, timeout=30.0):
    """Polls ``handle`` every 10 ms until it reports done; returns how many
    polls it took.

    Not every millisecond: in the two-namespace job (4 ranks on 2 cores,
    Open MPI over TCP), four threads waking every millisecond while no
    caller waits left a negotiation message unread in rank 0's socket
    until the polling stopped (seen with ss: bytes queued in Recv-Q, the
    engine's epoll reporting nothing). Every 10 ms the same job passes.
    """
    deadline = time.monotonic() + timeout
    polls = 0
    while not hora.poll(handle):
        polls += 1
        assert time.monotonic() < deadline, "poll() never became True"
        time.sleep(0.01)
    return polls


@pytest.mark.parametrize("dtype", INPLACE_DTYPES, ids=dtype_name)
def test_allreduce_inplace_returns_same_array(dtype, rank, size):
    tag = f"inplace.allreduce_.{dtype_name(dtype)}"
    op = hora.Max if is_bool(dtype) else hora.Sum
    x = rank_input(tag, rank, (4, 3), dtype)
    result = hora.allreduce_(x, name=tag, op=op)
    assert result is x
    assert_same(x, reduce_reference(inputs_of(tag, range(size), (4, 3), dtype), op, dtype))


@pytest.mark.parametrize("dtype", [np.int16, np.float32, np.float16], ids=dtype_name)
def test_allreduce_inplace_average(dtype, rank, size):
    tag = f"inplace.allreduce_.avg.{dtype_name(dtype)}"
    x = rank_input(tag, rank, (9,), dtype)
    result = hora.allreduce_(x, name=tag)
    assert result is x
    expected = reduce_reference(inputs_of(tag, range(size), (9,), dtype), hora.Average, dtype)
    assert_reduced(x, expected, hora.Average)


def test_allreduce_inplace_on_a_view(rank, size):
    # A contiguous slice of a bigger buffer: only the slice changes.
    tag = "inplace.view"
    base = np.full(10, -1, np.int32)
    view = base[2:7]
    view[:] = rank_input(tag, rank, (5,), np.int32)
    result = hora.allreduce_(view, name=tag, op=hora.Sum)
    assert result is view
    expected = reduce_reference(inputs_of(tag, range(size), (5,), np.int32), hora.Sum, np.int32)
    assert_same(base[2:7], expected)
    assert_same(base[:2], np.full(2, -1, np.int32))
    assert_same(base[7:], np.full(3, -1, np.int32))


@pytest.mark.parametrize("dtype", INPLACE_DTYPES, ids=dtype_name)
def test_allreduce_async_inplace(dtype, rank, size):
    tag = f"inplace.allreduce_async_.{dtype_name(dtype)}"
    op = hora.Min if is_bool(dtype) else hora.Max
    x = rank_input(tag, rank, (6,), dtype)
    handle = hora.allreduce_async_(x, name=tag, op=op)
    wait_until_done(handle)
    result = hora.synchronize(handle)
    assert result is x
    assert_same(x, reduce_reference(inputs_of(tag, range(size), (6,), dtype), op, dtype))


@pytest.mark.parametrize("dtype", INPLACE_DTYPES, ids=dtype_name)
def test_broadcast_async_inplace(dtype, rank, size):
    tag = f"inplace.broadcast_async_.{dtype_name(dtype)}"
    root = size - 1
    x = rank_input(tag, rank, (2, 5), dtype)
    handle = hora.broadcast_async_(x, root, name=tag)
    result = hora.synchronize(handle)
    assert result is x
    assert hora.poll(handle)
    assert_same(x, rank_input(tag, root, (2, 5), dtype))


def test_allreduce_async_poll_and_synchronize(rank, size):
    tag = "async.allreduce"
    x = rank_input(tag, rank, (8,), np.float64)
    handle = hora.allreduce_async(x, name=tag, op=hora.Sum)
    assert isinstance(handle, hora.Handle)
    wait_until_done(handle)
    result = hora.synchronize(handle)
    again = hora.synchronize(handle)  # a second synchronize gives the same result
    assert hora.poll(handle)
    assert result is not x
    assert again is result
    assert_same(result, reduce_reference(inputs_of(tag, range(size), (8,), np.float64),
                                         hora.Sum, np.float64))


def test_synchronize_without_polling(rank, size):
    tag = "async.sync_only"
    handle = hora.allreduce_async(np.full(3, rank, np.int64), name=tag, op=hora.Sum)
    result = hora.synchronize(handle)
    assert_same(result, np.full(3, size * (size - 1) // 2, np.int64))


def test_every_async_collective(rank, size):
    tag = "async.all_kinds"
    x = rank_input(tag, rank, (2 * size + 1, 2), np.int32)
    even = rank_input(tag + ".even", rank, (size, 2), np.int32)
    handles = {
        "allreduce": hora.allreduce_async(x, name=tag + ".allreduce", op=hora.Sum),
        "allgather": hora.allgather_async(x, name=tag + ".allgather"),
        "broadcast": hora.broadcast_async(x, 0, name=tag + ".broadcast"),
        "alltoall": hora.alltoall_async(even, name=tag + ".alltoall"),
        "reducescatter": hora.reducescatter_async(x, name=tag + ".reducescatter", op=hora.Min),
    }
    for handle in handles.values():
        wait_until_done(handle)
    results = {kind: hora.synchronize(handle) for kind, handle in handles.items()}

    everyone = inputs_of(tag, range(size), (2 * size + 1, 2), np.int32)
    evens = inputs_of(tag + ".even", range(size), (size, 2), np.int32)
    assert_same(results["allreduce"], reduce_reference(everyone, hora.Sum, np.int32))
    assert_same(results["allgather"], np.concatenate(everyone))
    assert_same(results["broadcast"], everyone[0])
    exchanged, received = results["alltoall"]
    assert_same(exchanged, np.concatenate([e[rank:rank + 1] for e in evens]))
    assert_same(received, np.ones(size, np.int64))
    assert_same(results["reducescatter"],
                reducescatter_block(reduce_reference(everyone, hora.Min, np.int32), rank, size))


def test_handles_synchronized_in_reverse_order(rank, size):
    tag = "async.reverse"
    count = 12
    inputs = [rank_input(f"{tag}.{i}", rank, (i + 1,), np.float32) for i in range(count)]
    handles = [hora.allreduce_async(x, name=f"{tag}.{i}", op=hora.Sum)
               for i, x in enumerate(inputs)]
    results = [None] * count
    for i in reversed(range(count)):
        results[i] = hora.synchronize(handles[i])
    for i, result in enumerate(results):
        expected = reduce_reference(inputs_of(f"{tag}.{i}", range(size), (i + 1,), np.float32),
                                    hora.Sum, np.float32)
        assert_same(result, expected)


def test_input_may_be_changed_after_synchronize(rank, size):
    # The out-of-place result is a separate array: changing the input
    # afterwards must not change it.
    x = np.full(4, rank + 1, np.int32)
    result = hora.allreduce(x, name="async.independent", op=hora.Sum)
    x[:] = 100
    assert_same(result, np.full(4, size * (size + 1) // 2, np.int32))


def test_name_can_be_reused_after_completion(rank, size):
    tag = "async.reuse"
    first = hora.allreduce(np.full(2, rank, np.int32), name=tag, op=hora.Sum)
    second = hora.allreduce(np.full(2, rank + 1, np.int32), name=tag, op=hora.Sum)
    third = hora.allreduce(np.full(2, 1, np.int32), name=tag, op=hora.Sum)
    assert_same(first, np.full(2, size * (size - 1) // 2, np.int32))
    assert_same(second, np.full(2, size * (size + 1) // 2, np.int32))
    assert_same(third, np.full(2, size, np.int32))


def test_dropped_handle_still_completes(rank, size):
    # A handle dropped without synchronize finishes in the background (as
    # in Horovod): its name stays in flight until then, and is free once
    # every rank is past a later collective.
    tag = "async.dropped"
    handle = hora.allreduce_async(np.full(2, rank, np.int32), name=tag, op=hora.Sum)
    del handle
    hora.barrier()
    again = hora.allreduce(np.full(2, rank, np.int32), name=tag, op=hora.Sum)
    assert_same(again, np.full(2, size * (size - 1) // 2, np.int32))
