"""The communicator the benchmarks time and gather results over.

Launched by mpirun, that is MPI's world. Launched with ``horarun
--transport tcp`` there is no MPI job: each rank's ``MPI.COMM_WORLD`` is a
world of its own (a singleton), so barriers and the slowest-rank maxima
would mean nothing and every rank would take itself for rank 0. There the
benchmarks get :class:`HoraWorld` instead, the same few calls made with
hora's own collectives.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

import hora

# (mpi4py's Op objects compare but do not hash)
_REDUCE = ((MPI.MAX, max, np.maximum.reduce), (MPI.MIN, min, np.minimum.reduce),
           (MPI.SUM, sum, np.add.reduce))


def _reduction(op, arrays):
    for known, on_objects, on_arrays in _REDUCE:
        if op == known:
            return on_arrays if arrays else on_objects
    raise ValueError(f"HoraWorld: no reduction {op!r} (MPI.MAX, MPI.MIN or MPI.SUM)")


def has_mpi_world():
    """Whether the ranks were started as one MPI job (mpirun): MPI's world
    is hora's. After ``hora.init()``."""
    return MPI.COMM_WORLD.Get_size() == hora.size()


def world():
    """MPI's world when it is hora's, else a :class:`HoraWorld`."""
    return MPI.COMM_WORLD if has_mpi_world() else HoraWorld()


class _Done:
    """What ``Ibarrier`` returns: the barrier already happened."""

    def Test(self):  # noqa: N802 (mpi4py's names)
        return True

    def Wait(self):  # noqa: N802
        return None


class HoraWorld:
    """The part of mpi4py's communicator interface the benchmarks use, over
    hora's collectives (every rank of the job). Each call is collective,
    as in MPI."""

    def Get_rank(self):  # noqa: N802
        return hora.rank()

    def Get_size(self):  # noqa: N802
        return hora.size()

    def Barrier(self):  # noqa: N802
        hora.barrier()

    def Ibarrier(self):  # noqa: N802
        # hora's barrier waits without spinning on the caller's core, which
        # is what the benchmarks' sleeping barriers want
        hora.barrier()
        return _Done()

    def bcast(self, obj, root=0):
        return hora.broadcast_object(obj, root_rank=root, name="bench.world.bcast")

    def allreduce(self, obj, op=MPI.SUM):
        reduce = _reduction(op, arrays=False)
        return reduce(hora.allgather_object(obj, name="bench.world.allreduce"))

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):  # noqa: N802
        reduce = _reduction(op, arrays=True)
        values = hora.allgather_object(np.asarray(sendbuf), name="bench.world.Allreduce")
        recvbuf[...] = reduce(values)

    def gather(self, obj, root=0):
        everyone = hora.allgather_object(obj, name="bench.world.gather")
        return everyone if hora.rank() == root else None

    def Split(self, *_args):  # noqa: N802
        raise SystemExit("--process-set and --busy-set need the ranks started as one MPI job "
                         "(horarun without --transport tcp)")
