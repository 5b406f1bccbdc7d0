"""The stall inspector: a collective that one rank never submits is reported
by rank 0 with the missing rank named, and with a shutdown time set every
rank raises instead of hanging. Each test runs hora with its own stall
settings and leaves it initialized as the session expects."""

import os
import time

import numpy as np
import pytest

import hora

@pytest.fixture
def stall_settings(size, restart_hora):
    if size == 1:
        pytest.skip("a stall needs a rank that stays behind")
    if os.environ.get("HORA_ALLREDUCE_ALGORITHM", "auto") != "auto":
        pytest.skip("the stall inspector does not depend on the allreduce path; "
                    "the jobs with the automatic choice cover it")
    return restart_hora


def wait_for_warning(capfd, deadline):
    """Rank 0's captured stderr once it holds a stall warning (or at the deadline)."""
    seen = ""
    while time.monotonic() < deadline:
        seen += capfd.readouterr().err
        if "stall inspector" in seen:
            break
        time.sleep(0.05)
    return seen


@pytest.mark.parametrize("cached", [False, True], ids=["new", "cached"])
def test_missing_rank_is_named_within_the_check_time(stall_settings, capfd, rank, size, cached):
    stall_settings(HORA_STALL_CHECK_TIME_SECONDS=2)
    name = f"stall.{'cached' if cached else 'new'}"
    x = np.ones(4, np.float32)
    if cached:
        # Once through every rank: the tensor is then answered by the cache,
        # whose requests never reach the coordinator unless pulled off it.
        hora.allreduce(x, name=name, op=hora.Sum)
        hora.allreduce(x, name="stall.before", op=hora.Sum)
    capfd.readouterr()
    late = 1
    if rank == late:
        time.sleep(4.0)
        result = hora.allreduce(x, name=name, op=hora.Sum)
    else:
        began = time.monotonic()
        handle = hora.allreduce_async(x, name=name, op=hora.Sum)
        if rank == 0:
            seen = wait_for_warning(capfd, began + 3.8)
            waited = time.monotonic() - began
            assert "stall inspector" in seen, f"no stall warning within {waited:.1f} s: {seen!r}"
            assert 2.0 <= waited < 3.8, waited
            assert f"allreduce '{name}'" in seen, seen
            assert f"not by rank {late}" in seen, seen
            # What the missing rank last did is part of the report.
            expected = f"rank {late} 'stall.before'" if cached else "last submitted"
            assert expected in seen, seen
        result = hora.synchronize(handle)
    np.testing.assert_array_equal(result, np.full(4, size, np.float32))


def test_shutdown_time_fails_every_rank(stall_settings, rank, size):
    stall_settings(HORA_STALL_CHECK_TIME_SECONDS=1, HORA_STALL_SHUTDOWN_TIME_SECONDS=2)
    x = np.ones(4, np.float32)
    # Rank 1 goes its own way (a collective no one else calls): everyone
    # waits on someone, the classic hang.
    name = "stall.other" if rank == 1 else "stall.fatal"
    began = time.monotonic()
    with pytest.raises(hora.HoraTimeoutError) as failure:
        hora.allreduce(x, name=name, op=hora.Sum)
    seconds = time.monotonic() - began
    message = str(failure.value)
    assert 2.0 <= seconds < 8.0, seconds
    assert "HORA_STALL_SHUTDOWN_TIME_SECONDS" in message, message
    assert "allreduce 'stall.fatal'" in message and "not by rank 1" in message, message
    assert "rank 1 'stall.other'" in message, message
    # The job is stopped on every rank: later calls fail at once, naming why.
    with pytest.raises(hora.HoraError, match="stall"):
        hora.allreduce(x, name="stall.after", op=hora.Sum)


def test_stall_inside_a_process_set_names_job_ranks(stall_settings, capfd, rank, size):
    if size < 3:
        pytest.skip("needs a set that does not start at rank 0")
    stall_settings(HORA_STALL_CHECK_TIME_SECONDS=2)
    pair = hora.add_process_set([1, 2])  # its first rank, job rank 1, inspects it
    x = np.ones(4, np.float32)
    capfd.readouterr()
    if rank == 2:
        time.sleep(4.0)
        result = hora.allreduce(x, name="stall.set", op=hora.Sum, process_set=pair)
    elif rank == 1:
        began = time.monotonic()
        handle = hora.allreduce_async(x, name="stall.set", op=hora.Sum, process_set=pair)
        seen = wait_for_warning(capfd, began + 3.8)
        assert "stall inspector" in seen, f"no stall warning: {seen!r}"
        assert "allreduce 'stall.set'" in seen and "not by rank 2" in seen, seen
        result = hora.synchronize(handle)
    if rank in (1, 2):
        np.testing.assert_array_equal(result, np.full(4, 2.0))
    hora.barrier()
    hora.remove_process_set(pair)


@pytest.mark.parametrize("cached", [False, True], ids=["new", "cached"])
def test_a_call_refused_for_a_name_in_flight_fails_the_ranks_that_wait(
        stall_settings, rank, size, cached):
    # The last rank calls a name twice while its first call is in flight:
    # the second call is refused there (ValueError) and that rank goes on.
    # The other ranks call the name twice after the first call finished,
    # and their second call, which the last rank will never match, fails
    # after the stall check time with the reason instead of stalling on.
    stall_settings(HORA_STALL_CHECK_TIME_SECONDS=1)
    name = f"stall.again.{'cached' if cached else 'new'}"
    x = np.ones(4, np.float32)
    refusing = size - 1
    if cached:  # once through every rank first: the cache then answers the name
        hora.allreduce(x, name=name, op=hora.Sum)
    if rank == refusing:
        first = hora.allreduce_async(x, name=name, op=hora.Sum)
        with pytest.raises(ValueError, match="already in flight"):
            hora.allreduce_async(x, name=name, op=hora.Sum)
        # only now may the others complete the first call
        hora.allreduce(np.zeros(1, np.int8), name="stall.again.gate", op=hora.Sum)
        np.testing.assert_array_equal(hora.synchronize(first), np.full(4, size, np.float32))
    else:
        hora.allreduce(np.zeros(1, np.int8), name="stall.again.gate", op=hora.Sum)
        np.testing.assert_array_equal(hora.allreduce(x, name=name, op=hora.Sum),
                                      np.full(4, size, np.float32))
        began = time.monotonic()
        with pytest.raises(hora.HoraInvalidArgumentError) as failure:
            hora.allreduce(x, name=name, op=hora.Sum)
        waited = time.monotonic() - began
        message = str(failure.value)
        assert 1.0 <= waited < 10.0, waited
        assert f"allreduce '{name}' cannot complete: rank {refusing} refused a call" in message, \
            message
        assert "HORA_STALL_CHECK_TIME_SECONDS" in message, message
        others = ", ".join(str(r) for r in range(size - 1))
        assert f"{'rank' if size == 2 else 'ranks'} {others} waited" in message, message
    # nothing was left behind: the job and the name work on every rank
    np.testing.assert_array_equal(hora.allreduce(x, name="stall.again.after", op=hora.Sum),
                                  np.full(4, size, np.float32))
    np.testing.assert_array_equal(hora.allreduce(x, name=name, op=hora.Sum),
                                  np.full(4, size, np.float32))


def test_a_refused_call_made_again_later_meets_the_waiting_ranks(stall_settings, rank, size):
    # As above, but the refusing rank calls the name again (as the error
    # message suggests) before the stall check time: a program Horovod runs
    # fine, and the waiting ranks' call completes with it.
    stall_settings(HORA_STALL_CHECK_TIME_SECONDS=3)
    name = "stall.again.retried"
    x = np.ones(4, np.float32)
    refusing = size - 1
    if rank == refusing:
        first = hora.allreduce_async(x, name=name, op=hora.Sum)
        with pytest.raises(ValueError, match="already in flight"):
            hora.allreduce_async(x, name=name, op=hora.Sum)
        hora.allreduce(np.zeros(1, np.int8), name="stall.again.gate", op=hora.Sum)
        hora.synchronize(first)
        time.sleep(0.5)  # the others' second call is waiting by now
        result = hora.allreduce(x, name=name, op=hora.Sum)
    else:
        hora.allreduce(np.zeros(1, np.int8), name="stall.again.gate", op=hora.Sum)
        hora.allreduce(x, name=name, op=hora.Sum)
        result = hora.allreduce(x, name=name, op=hora.Sum)
    np.testing.assert_array_equal(result, np.full(4, size, np.float32))
