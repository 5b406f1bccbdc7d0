"""GPU tests: they need a CUDA GPU and a PyTorch that sees it. Everywhere
else each test here is reported as skipped with that reason (the CPU test
machines have neither); the compile-only check of the CUDA build is
tests/test_cuda_build.py, which runs without a GPU."""
from pathlib import Path

import pytest
import torch

import hora.torch as hvd

HERE = Path(__file__).resolve().parent
NO_GPU = None if torch.cuda.is_available() else \
    "no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False)"


def pytest_collection_modifyitems(config, items):
    if NO_GPU is None:
        return
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=NO_GPU))


@pytest.fixture(scope="session", autouse=True)
def hora_job():
    """A one-rank job for the whole session, on GPU 0."""
    if NO_GPU is not None:
        yield
        return
    torch.cuda.set_device(0)
    hvd.init()
    yield


@pytest.fixture
def needs_cuda_build():
    if not hvd.cuda_built():
        pytest.skip("this hora was built without HORA_WITH_CUDA=1 (no NCCL or CUDA kernels)")
