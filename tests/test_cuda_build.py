"""The CUDA build compiles and links on a machine without a GPU, so the GPU
path cannot rot unseen: `HORA_WITH_CUDA=1 pip wheel .` must succeed, the
wheel's core must import and run CPU collectives with no NVIDIA driver, and
report its CUDA and NCCL versions; a CUDA build whose nvcc or NCCL is
missing must fail with a message that says what was searched.

Needs nvcc (the CUDA toolkit) and NCCL (scripts/run_tests.sh installs the
nvidia-nccl wheel next to nvcc); skipped, saying so, where nvcc is absent.
"""
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _nvcc():
    found = shutil.which("nvcc")
    if found is None and os.path.exists("/usr/local/cuda/bin/nvcc"):
        found = "/usr/local/cuda/bin/nvcc"
    return found


NVCC = _nvcc()
pytestmark = pytest.mark.skipif(
    NVCC is None, reason="no CUDA toolkit (nvcc) on this machine, so the CUDA build cannot be "
                         "compiled here")


def _nccl_dir():
    """The nvidia-nccl wheel's directory in this environment, if installed."""
    path = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "nccl"
    return path if (path / "include" / "nccl.h").exists() else None


def _build_wheel(out, **env):
    environment = dict(os.environ, HORA_WITH_CUDA="1", **env)
    return subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q",
         "-w", str(out), f"-Cbuild-dir={out / 'build'}", str(REPO)],
        env=environment, capture_output=True, text=True, timeout=1500)


@pytest.fixture(scope="module")
def cuda_package(tmp_path_factory):
    """The CUDA wheel, unpacked, and the environment that imports it."""
    if _nccl_dir() is None and not os.environ.get("NCCL_HOME"):
        pytest.fail("nvcc is installed but NCCL is not: install nvidia-nccl-cu<N> "
                    "(scripts/run_tests.sh does) or set NCCL_HOME")
    out = tmp_path_factory.mktemp("cuda-wheel")
    done = _build_wheel(out)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    wheels = list(out.glob("hora-*.whl"))
    assert len(wheels) == 1, wheels
    package = out / "package"
    with zipfile.ZipFile(wheels[0]) as archive:
        archive.extractall(package)
    # Installed, the core finds libmpi and NCCL by run paths relative to
    # site-packages; unpacked elsewhere it needs the library path.
    libraries = [os.path.join(sys.prefix, "lib")]
    if _nccl_dir() is not None:
        libraries.append(str(_nccl_dir() / "lib"))
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    env.update(PYTHONPATH=str(package),
               LD_LIBRARY_PATH=os.pathsep.join(libraries + [env.get("LD_LIBRARY_PATH", "")]))
    return package, env


def _python(code, env):
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)


def test_cuda_build_reports_cuda_and_nccl(cuda_package):
    package, env = cuda_package
    done = _python("import hora, json; print(json.dumps(hora.build_info()))", env)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert info["cuda_built"] is True and info["nccl_built"] is True
    assert "90" in info["cuda_architectures"], info  # Hopper is in the default list
    release = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout
    assert f"release {info['cuda_compiled']}" in release, (info, release)
    if _nccl_dir() is not None and not os.environ.get("NCCL_HOME"):
        major = info["cuda_compiled"].split(".")[0]
        wheel_version = importlib.metadata.version(f"nvidia-nccl-cu{major}")
        assert info["nccl"] == info["nccl_compiled"] == wheel_version, info
    # horarun --check-build shows the versions.
    done = subprocess.run([sys.executable, "-m", "hora.runner", "--check-build"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"built in: {info['nccl']} loaded" in done.stdout, done.stdout
    assert f"compiled with CUDA {info['cuda_compiled']}" in done.stdout, done.stdout


def test_cuda_build_runs_cpu_collectives_without_a_gpu(cuda_package):
    """The CPU path of a CUDA build is the CPU path: a 1-rank job reduces
    NumPy and torch tensors as usual, and the GPU entry points say what is
    missing instead of crashing."""
    package, env = cuda_package
    code = """
import numpy as np, torch, hora
import hora.torch as hvd
from hora import _C
hvd.init()
x = np.arange(7, dtype=np.float32)
assert np.array_equal(hora.allreduce(x, name="np", op=hora.Sum), x)
t = torch.arange(5, dtype=torch.float64)
assert torch.equal(hvd.allreduce(t, name="t"), t)
assert torch.equal(hvd.allgather(t, name="g"), t)
try:
    _C.gpu_memcpy(0, 0, 16)
except RuntimeError as error:
    print("gpu error:", error)
else:
    raise AssertionError("a CUDA call without a driver did not fail")
hvd.shutdown()
print("ok")
"""
    done = _python(code, env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok" in done.stdout
    # Names the failing call and CUDA's reason (no driver, or no device).
    assert "gpu error: cudaMemcpyAsync failed: cudaError" in done.stdout, done.stdout


def test_missing_nccl_fails_with_what_was_searched(tmp_path):
    done = _build_wheel(tmp_path, NCCL_HOME=str(tmp_path / "no-nccl-here"))
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "NCCL_HOME=" in output and "does not hold NCCL" in output, output[-4000:]
    assert "include/nccl.h" in output


def test_missing_nvcc_fails_with_how_to_fix_it(tmp_path):
    done = _build_wheel(tmp_path, CUDACXX=str(tmp_path / "bin" / "nvcc"))
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "no CUDA compiler (nvcc) was found" in output, output[-4000:]
    assert "CUDACXX" in output
