"""The implementations a benchmark can compare: each is an object with
``name``, ``reason`` (None when usable, else why not) and collectives on a
NumPy float32 buffer; one with a background thread sets ``background`` and
has ``start``/``stop`` (see :func:`phases`)."""

import contextlib
import os

import numpy as np
from mpi4py import MPI

import hora
from hora.bench import world as bench_world


class Scope:
    """Where a benchmark runs: every rank (the default), or with
    ``--process-set`` a subset: hora's collectives in that process set, and
    the alternatives on an MPI communicator of the same ranks."""

    def __init__(self, comm=None, process_set=None):
        self._comm = comm
        self.process_set = process_set or hora.global_process_set

    @property
    def comm(self):
        """The communicator given, else the job's (see :mod:`hora.bench.world`)."""
        return self._comm if self._comm is not None else bench_world.world()

    @property
    def subset(self):
        return self.process_set is not hora.global_process_set


SCOPE = Scope()


class Hora:
    name = "hora"

    def __init__(self):
        self.reason = None
        self.ps = SCOPE.process_set
        self.root = self.ps.ranks[0] if SCOPE.subset else 0  # a global rank

    def allreduce(self, buffer):
        hora.allreduce_(buffer, name="bench.allreduce", op=hora.Sum, process_set=self.ps)

    def allreduce_async_many(self, buffers):
        handles = [hora.allreduce_async_(b, name=f"bench.many.{i}", op=hora.Sum,
                                         process_set=self.ps)
                   for i, b in enumerate(buffers)]
        for handle in handles:
            hora.synchronize(handle)

    def allgather(self, buffer):
        return hora.allgather(buffer, name="bench.allgather", process_set=self.ps)

    def broadcast(self, buffer):
        hora.broadcast_(buffer, self.root, name="bench.broadcast", process_set=self.ps)

    def reducescatter(self, buffer):
        return hora.reducescatter(buffer, name="bench.reducescatter", op=hora.Sum,
                                  process_set=self.ps)

    def alltoall(self, buffer):
        return hora.alltoall(buffer, name="bench.alltoall", process_set=self.ps)[0]


class Mpi:
    """Raw MPI through mpi4py: the floor a user would otherwise write."""

    name = "mpi"

    def __init__(self):
        self.reason = None if bench_world.has_mpi_world() else (
            "the ranks are not one MPI job (horarun --transport tcp)")
        self.comm = SCOPE.comm

    def allreduce(self, buffer):
        self.comm.Allreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)

    def allreduce_async_many(self, buffers):
        # What a user without an engine writes: one blocking call per tensor.
        for b in buffers:
            self.comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)

    def allgather(self, buffer):
        out = np.empty((self.comm.Get_size(),) + buffer.shape, buffer.dtype)
        self.comm.Allgather(buffer, out)
        return out

    def broadcast(self, buffer):
        self.comm.Bcast(buffer, root=0)

    def reducescatter(self, buffer):
        size = self.comm.Get_size()
        out = np.empty(buffer.size // size, buffer.dtype)
        self.comm.Reduce_scatter_block(buffer[:out.size * size], out, op=MPI.SUM)
        return out

    def alltoall(self, buffer):
        out = np.empty_like(buffer)
        self.comm.Alltoall(buffer, out)
        return out


class Gloo:
    """torch.distributed with the gloo backend over loopback TCP."""

    name = "gloo"

    def __init__(self):
        self.reason = None
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            self.reason = "torch is not installed"
            return
        comm = SCOPE.comm
        port = comm.bcast(_free_port() if comm.Get_rank() == 0 else None, root=0)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=comm.Get_rank(), world_size=comm.Get_size())
        self.torch, self.dist = torch, dist

    def stop(self):
        # Joins gloo's worker threads. Left running into interpreter exit,
        # one of them can drop its last tensor there and abort the process
        # while taking the GIL.
        self.dist.destroy_process_group()

    def allreduce(self, buffer):
        self.dist.all_reduce(self.torch.from_numpy(buffer))

    def allreduce_async_many(self, buffers):
        works = [self.dist.all_reduce(self.torch.from_numpy(b), async_op=True) for b in buffers]
        for work in works:
            work.wait()

    def allgather(self, buffer):
        tensor = self.torch.from_numpy(buffer)
        out = [self.torch.empty_like(tensor) for _ in range(self.dist.get_world_size())]
        self.dist.all_gather(out, tensor)
        return out

    def broadcast(self, buffer):
        self.dist.broadcast(self.torch.from_numpy(buffer), 0)

    def reducescatter(self, buffer):
        raise NotImplementedError("gloo has no reduce_scatter on CPU")

    def alltoall(self, buffer):
        raise NotImplementedError("gloo has no all_to_all on CPU")


class Horovod:
    """Horovod through horovod.torch, when it is installed. Its background
    thread polls all the time it is initialized, which would slow every other
    implementation measured beside it, so it runs in a phase of its own
    (``background``): initialized by ``start`` and shut down by ``stop``."""

    name = "horovod"
    background = True

    def __init__(self):
        self.reason = None
        try:
            import horovod.torch as hvd
            import torch
        except ImportError:
            self.reason = "horovod is not installed"
            return
        self.hvd, self.torch = hvd, torch

    def start(self):
        self.hvd.init()

    def stop(self):
        self.hvd.shutdown()

    def allreduce(self, buffer):
        self.hvd.allreduce_(self.torch.from_numpy(buffer), name="bench.allreduce", op=self.hvd.Sum)

    def allreduce_async_many(self, buffers):
        handles = [self.hvd.allreduce_async_(self.torch.from_numpy(b), name=f"bench.many.{i}",
                                             op=self.hvd.Sum) for i, b in enumerate(buffers)]
        for handle in handles:
            self.hvd.synchronize(handle)

    def allgather(self, buffer):
        return self.hvd.allgather(self.torch.from_numpy(buffer), name="bench.allgather").numpy()

    def broadcast(self, buffer):
        self.hvd.broadcast_(self.torch.from_numpy(buffer), 0, name="bench.broadcast")

    def reducescatter(self, buffer):
        return self.hvd.reducescatter(self.torch.from_numpy(buffer), name="bench.reducescatter",
                                      op=self.hvd.Sum).numpy()

    def alltoall(self, buffer):
        return self.hvd.alltoall(self.torch.from_numpy(buffer), name="bench.alltoall").numpy()


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


KNOWN = {"hora": Hora, "mpi": Mpi, "gloo": Gloo, "horovod": Horovod}


def load(names, log):
    """Instantiates the requested implementations, reporting the unavailable."""
    result = []
    for name in names:
        if name not in KNOWN:
            raise SystemExit(f"unknown implementation {name!r}; choose from {', '.join(KNOWN)}")
        if SCOPE.subset and name in ("gloo", "horovod"):
            log(f"# skipping {name}: not measured inside a --process-set")
            continue
        impl = KNOWN[name]()
        if impl.reason:
            log(f"# skipping {name}: {impl.reason}")
        else:
            result.append(impl)
    return result


def phases(impls):
    """The implementations in the groups they are measured in: every quiet
    one together (interleaved, so that drift hits them alike), then each one
    with a background thread alone. Run each group inside :func:`started`."""
    quiet = [i for i in impls if not getattr(i, "background", False)]
    groups = [quiet] if quiet else []
    return groups + [[i] for i in impls if getattr(i, "background", False)]


@contextlib.contextmanager
def started(group):
    """Starts the group's implementations (those with a ``start``) and stops
    whichever started when the block ends, on errors too."""
    running = []
    try:
        for impl in group:
            getattr(impl, "start", lambda: None)()
            running.append(impl)
        yield group
    finally:
        for impl in reversed(running):
            getattr(impl, "stop", lambda: None)()
