"""Handles and waits as Horovod users rely on them: a handle nobody keeps
never blocks its caller, and a blocked wait gives way to Python's signal
handlers (Ctrl-C) within a fraction of a second."""

import contextlib
import gc
import signal
import time

import numpy as np
import pytest

import hora


class Interrupted(Exception):
    pass


@contextlib.contextmanager
def interrupted_after(seconds):
    """A SIGALRM handler that raises Interrupted, armed for ``seconds``."""
    def interrupt(signum, frame):
        raise Interrupted()
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_dropped_handle_does_not_block(rank, size):
    # Rank 0 drops its handle and only then reaches the barrier; the others
    # submit the collective only after the barrier. Had the drop waited for
    # the collective, rank 0 would never reach the barrier: a deadlock.
    x = np.full(4, rank + 1.0)
    if rank == 0:
        hora.allreduce_async(x, name="waits.dropped", op=hora.Sum)
        gc.collect()
    hora.barrier()
    if rank != 0:
        handle = hora.allreduce_async(x, name="waits.dropped", op=hora.Sum)
        np.testing.assert_array_equal(hora.synchronize(handle),
                                      np.full(4, size * (size + 1) / 2))
    # once everyone is past it, the dropped one has finished and its name is
    # free again
    hora.barrier()
    again = hora.allreduce(np.ones(2), name="waits.dropped", op=hora.Sum)
    np.testing.assert_array_equal(again, np.full(2, float(size)))


def test_a_dropped_handle_that_fails_is_reported(rank, size, capfd):
    if size == 1:
        pytest.skip("ranks must disagree about the collective")
    hora.allreduce_async(np.ones(2 + rank), name="waits.dropped.bad")  # shapes differ
    gc.collect()
    hora.barrier()
    hora.allreduce(np.ones(1), name="waits.after.bad")  # lets go of the finished one
    assert "a collective whose handle was dropped failed: Mismatched shape for allreduce " \
           "'waits.dropped.bad'" in capfd.readouterr().err


def test_a_blocked_wait_runs_signal_handlers(rank, size):
    if size == 1:
        pytest.skip("needs a peer that submits late")
    x = np.full(3, rank + 1.0)
    if rank == 0:
        handle = hora.allreduce_async(x, name="waits.late", op=hora.Sum)
        started = time.monotonic()
        with interrupted_after(0.3), pytest.raises(Interrupted):
            hora.synchronize(handle)
        assert time.monotonic() - started < 1.0  # handlers run within 100 ms
        assert not hora.poll(handle)
    hora.barrier()  # only now do the others submit
    if rank != 0:
        handle = hora.allreduce_async(x, name="waits.late", op=hora.Sum)
    # the interrupted handle is still good: waiting again gives the result
    np.testing.assert_array_equal(hora.synchronize(handle), np.full(3, size * (size + 1) / 2))


def test_an_interrupted_in_place_wait_keeps_the_handle(rank, size):
    if size == 1:
        pytest.skip("needs a peer that submits late")
    x = np.full(3, rank + 1.0)
    if rank == 0:
        handle = hora.allreduce_async_(x, name="waits.late.inplace", op=hora.Sum)
        with interrupted_after(0.3), pytest.raises(Interrupted):
            hora.synchronize(handle)
    hora.barrier()
    if rank != 0:
        handle = hora.allreduce_async_(x, name="waits.late.inplace", op=hora.Sum)
    assert hora.synchronize(handle) is x
    np.testing.assert_array_equal(x, np.full(3, size * (size + 1) / 2))


def test_a_dropped_torch_handle_does_not_block(rank, size):
    torch = pytest.importorskip("torch")
    import hora.torch as hvd
    x = torch.full((4,), rank + 1.0)
    if rank == 0:
        hvd.allreduce_async_(x, name="waits.torch.dropped", op=hvd.Sum)
        hvd.allgather_async(x, name="waits.torch.dropped.gather")
        gc.collect()
    hora.barrier()
    if rank != 0:
        hvd.synchronize(hvd.allreduce_async_(x, name="waits.torch.dropped", op=hvd.Sum))
        gathered = hvd.synchronize(hvd.allgather_async(torch.full((4,), rank + 1.0),
                                                       name="waits.torch.dropped.gather"))
        assert gathered.shape == (4 * size,)
    hora.barrier()
    if rank == 0:  # the dropped in-place allreduce still wrote its result
        assert torch.equal(x, torch.full((4,), size * (size + 1) / 2))
