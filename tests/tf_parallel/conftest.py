"""Fixtures for the TensorFlow/Keras tests, which run on every rank under
horarun (driven by tests/test_tensorflow_suite.py). Inputs are made from
(test, rank), so each rank can compute every collective's expected result
itself."""

import os
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")

import hora.tensorflow as hvd  # noqa: E402


def rank_values(tag, rank, shape, dtype=np.float32):
    """Small exactly representable values, different for each (tag, rank)."""
    rng = np.random.default_rng(zlib.crc32(f"{tag}/{rank}".encode()))
    return (rng.integers(-4, 5, size=shape) / 2).astype(dtype)


@pytest.fixture(scope="session", autouse=True)
def hora_session():
    tf.config.threading.set_inter_op_parallelism_threads(2)
    hvd.init()
    yield
    hvd.shutdown()


@pytest.fixture
def rank():
    return hvd.rank()


@pytest.fixture
def size():
    return hvd.size()


@pytest.fixture(params=["eager", "graph"])
def mode(request):
    """Runs a test body eagerly and inside tf.function: ``mode(fn)(*args)``."""
    if request.param == "eager":
        return lambda fn: fn
    return lambda fn: tf.function(fn, jit_compile=False)
