"""Fixtures for the MXNet tests, which run on every rank under horarun in the
MXNet environment (driven by tests/test_mxnet_suite.py). Inputs are made
from (test, rank), so each rank can compute every collective's expected
result itself."""

import pytest
from rank_inputs import rank_values  # noqa: F401 (the tests import it from here)

mx = pytest.importorskip("mxnet")

import hora.mxnet as hvd  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def hora_session():
    # Dynamic process sets: tests add and remove the sets they use.
    hvd.init(process_sets="dynamic")
    yield
    hvd.shutdown()
