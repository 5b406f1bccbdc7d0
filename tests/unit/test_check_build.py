"""horarun --check-build: what is there, and why the rest is not."""
import subprocess
import sys

from hora.runner import check_build


def test_real_report_lists_every_section():
    done = subprocess.run([sys.executable, "-m", "hora.runner", "--check-build"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    for fragment in ("Frameworks:", "PyTorch", "TensorFlow", "Keras", "MXNet",
                     "[X] MPI controller", "CUDA", "NCCL", "Launcher:", "mpirun"):
        assert fragment in text, text
    # This CPU-only build says why the GPU parts are missing and how to get them.
    assert "HORA_WITH_CUDA=1" in text


def test_framework_states():
    lines = {label.split()[0]: (ok, text) for ok, label, text in
             check_build.framework_lines(probe_import=lambda module: None)}
    assert lines["PyTorch"] == (True, "import hora.torch as hvd")


def test_framework_that_does_not_import_says_why():
    def broken(module):
        return "ImportError: numpy.core.multiarray failed to import" if module == "torch" else None
    lines = {label.split()[0]: (ok, text)
             for ok, label, text in check_build.framework_lines(broken)}
    assert lines["PyTorch"][0] is False
    assert "does not import: ImportError: numpy.core.multiarray" in lines["PyTorch"][1]


def test_core_lines_for_a_cuda_build_and_a_cpu_only_one():
    base = {"mpi_library": "Open MPI v5.0.11", "mpi_source": "system",
            "mpi_library_path": "/usr/lib/libmpi.so.40",
            "cpu_kernels": {"generic": True, "avx2": True, "avx512": False}}
    cpu = {label: (ok, text) for ok, label, text in
           check_build.core_lines(dict(base, cuda_built=False, nccl_built=False))}
    assert cpu["MPI controller"] == (
        True, "Open MPI v5.0.11 from a system MPI, /usr/lib/libmpi.so.40")
    assert cpu["CUDA"][0] is False and "HORA_WITH_CUDA=1" in cpu["CUDA"][1]
    assert cpu["NCCL"][0] is False
    assert "avx2 is used" in cpu["CPU kernels"][1]
    assert "lacks the instructions for avx512" in cpu["CPU kernels"][1]
    gpu = {label: ok for ok, label, _ in
           check_build.core_lines(dict(base, cuda_built=True, nccl_built=True))}
    assert gpu["CUDA"] and gpu["NCCL"]


def test_missing_mpirun_is_explained():
    from hora.runner.mpi_command import MpiError

    def missing(**_):
        raise MpiError("horarun: no 'mpirun' found next to python or on PATH; install one")
    [(ok, label, text)] = check_build.launcher_lines(find=missing)
    assert not ok and text.startswith("no 'mpirun' found")
