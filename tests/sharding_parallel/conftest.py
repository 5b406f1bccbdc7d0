"""Fixtures for the sharded-optimizer tests, which run on every rank under
horarun (driven by tests/test_sharding_suite.py at 1, 2, 3 and 4 ranks)."""

import os

import pytest

import hora


@pytest.fixture(scope="session", autouse=True)
def hora_session():
    # Dynamic process sets: the hybrid tests add and remove their own sets.
    os.environ["HORA_DYNAMIC_PROCESS_SETS"] = "1"
    hora.init(process_sets="dynamic")
    yield
    hora.shutdown()
