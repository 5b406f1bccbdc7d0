"""At HORA_LOG_LEVEL=debug a mismatch error also says where each rank
submitted the collective."""

import pathlib

import numpy as np
import pytest

import hora

SOURCE = pathlib.Path(__file__).read_text().splitlines()


def line_of(marker):
    return next(i for i, text in enumerate(SOURCE, start=1) if text.rstrip().endswith(marker))


@pytest.fixture
def debug_level(size, restart_hora):
    if size == 1:
        pytest.skip("a mismatch needs two ranks")
    restart_hora(HORA_LOG_LEVEL="debug")


def submit_shape_mismatch(rank):
    if rank == 0:
        hora.allreduce(np.ones(2, np.float32), name="sites.shape")  # site-A
    else:
        hora.allreduce(np.ones(3, np.float32), name="sites.shape")  # site-B


def test_mismatch_names_every_ranks_call_site(debug_level, rank, size):
    with pytest.raises(hora.HoraMismatchError) as failure:
        submit_shape_mismatch(rank)
    message = str(failure.value)
    assert "Mismatched shape" in message and "submitted at:" in message, message
    assert f"rank 0 test_call_sites.py:{line_of('# site-A')} in submit_shape_mismatch" in message
    for other in range(1, size):
        assert f"rank {other} test_call_sites.py:{line_of('# site-B')} in submit_shape_mismatch" \
            in message, message


def test_no_call_sites_below_debug(rank, size):
    if size == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(hora.HoraMismatchError) as failure:
        hora.allreduce(np.ones(2 + rank, np.float32), name="sites.quiet")
    assert "submitted at" not in str(failure.value)
