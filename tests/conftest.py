import os

import pytest

# tests/parallel, tests/sharding_parallel, tests/tf_parallel and
# tests/mx_parallel run only under horarun (which sets HORA_RANK), driven by
# tests/test_parallel_suite.py, tests/test_sharding_suite.py,
# tests/test_tensorflow_suite.py and tests/test_mxnet_suite.py; a plain
# single-process pytest skips them.
collect_ignore = [] if "HORA_RANK" in os.environ else [
    "parallel", "sharding_parallel", "tf_parallel", "mx_parallel"]


@pytest.fixture
def rank():
    """This rank, in the multi-rank suites (after their session fixture's init)."""
    import hora
    return hora.rank()


@pytest.fixture
def size():
    """The world size, in the multi-rank suites."""
    import hora
    return hora.size()


@pytest.fixture
def job_env():
    """This environment without the rank variables of any MPI job the tests
    themselves run in, so that a job a test starts is a fresh one."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
