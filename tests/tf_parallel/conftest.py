"""Fixtures for the TensorFlow/Keras tests, which run on every rank under
horarun (driven by tests/test_tensorflow_suite.py). Inputs are made from
(test, rank), so each rank can compute every collective's expected result
itself."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
from rank_inputs import rank_values  # noqa: E402,F401 (the tests import it from here)

tf = pytest.importorskip("tensorflow")

import hora.tensorflow as hvd  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def hora_session():
    tf.config.threading.set_inter_op_parallelism_threads(2)
    # dynamic, so that tests can add and remove process sets
    hvd.init(process_sets="dynamic")
    yield
    hvd.shutdown()


@pytest.fixture(params=["eager", "graph"])
def mode(request):
    """Runs a test body eagerly and inside tf.function: ``mode(fn)(*args)``."""
    if request.param == "eager":
        return lambda fn: fn
    return lambda fn: tf.function(fn, jit_compile=False)
