"""Fixtures for tests that run on every rank under horarun.

Each test runs unchanged at any world size. Inputs are made deterministically
from (test, rank), so every rank can compute the expected result of a
collective over all ranks' inputs by itself and assert on it.
"""

import os
import zlib

import numpy as np
import pytest

import hora

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a test requirement
    BFLOAT16 = None

ALL_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64, np.float16, "bfloat16",
              np.float32, np.float64, np.bool_]


def resolve_dtype(dtype):
    if dtype == "bfloat16":
        if BFLOAT16 is None:
            pytest.skip("ml_dtypes is not installed")
        return BFLOAT16
    return np.dtype(dtype)


def rank_input(tag, rank, shape, dtype):
    """The array rank `rank` contributes for `tag`: small values so sums and
    products stay exact in every dtype."""
    dtype = resolve_dtype(dtype)
    rng = np.random.default_rng(zlib.crc32(f"{tag}/{rank}".encode()))
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        low = 0 if np.issubdtype(dtype, np.unsignedinteger) else -3
        return rng.integers(low, 4, size=shape).astype(dtype)
    return rng.integers(-4, 5, size=shape).astype(np.float32).astype(dtype) / 2


def pretend_hosts():
    """HORA_TEST_FAKE_HOSTS=k splits the ranks of this one machine into k
    consecutive blocks that hora treats as separate hosts (through
    HORA_HOSTNAME), so the hierarchical allreduce runs here."""
    hosts = int(os.environ.get("HORA_TEST_FAKE_HOSTS", "0"))
    if hosts:
        rank, size = int(os.environ["HORA_RANK"]), int(os.environ["HORA_SIZE"])
        os.environ["HORA_HOSTNAME"] = f"fake-host-{rank * hosts // size}"


@pytest.fixture(scope="session", autouse=True)
def hora_session():
    pretend_hosts()
    # Dynamic process sets: tests add and remove the sets they use, also
    # after tests that start hora anew with init().
    os.environ["HORA_DYNAMIC_PROCESS_SETS"] = "1"
    hora.init(process_sets="dynamic")
    yield
    hora.shutdown()


@pytest.fixture
def restart_hora():
    """``restart_hora(NAME=value, ...)`` runs hora anew with these settings
    (every rank calls it at the same point). Afterwards the job's own
    settings and a running hora come back, also after a test that stopped
    the job on purpose."""
    saved = {}

    def restart(**values):
        hora.barrier()
        hora.shutdown()
        for name, value in values.items():
            saved.setdefault(name, os.environ.get(name))
            os.environ[name] = str(value)
        hora.init(process_sets="dynamic")

    yield restart
    if not saved:
        return
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        hora.barrier()
    except hora.HoraError:
        pass  # the test stopped the job on purpose
    hora.shutdown()
    hora.init(process_sets="dynamic")
