"""Fixtures for the MXNet tests, which run on every rank under horarun in the
MXNet environment (driven by tests/test_mxnet_suite.py). Inputs are made
from (test, rank), so each rank can compute every collective's expected
result itself."""

import zlib

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

import hora.mxnet as hvd  # noqa: E402


def rank_values(tag, rank, shape, dtype=np.float32):
    """Small exactly representable values, different for each (tag, rank)."""
    rng = np.random.default_rng(zlib.crc32(f"{tag}/{rank}".encode()))
    values = rng.integers(-4, 5, size=shape) / 2
    if np.dtype(dtype).kind in "iu":
        values = np.abs(values * 2) if np.dtype(dtype).kind == "u" else values * 2
    return values.astype(dtype)


@pytest.fixture(scope="session", autouse=True)
def hora_session():
    hvd.init()
    yield
    hvd.shutdown()


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()
