"""hora.run (Horovod's horovod.run): a function run on N ranks under
horarun, its return values in rank order; a rank that raises ends the job
with that rank's error; Horovod's argument checks and deprecations."""

import os
import warnings

import pytest

import hora
from hora.cluster.job import JobError

pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def fresh_job(monkeypatch):
    """No rank variables of an MPI job the tests may run in: hora.run
    starts a job of its own from this process's environment."""
    for name in list(os.environ):
        if name.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_")):
            monkeypatch.delenv(name)


def _sum_of_ranks(offset, scale=1):
    import torch

    import hora.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum)
    print(f"rank {hvd.rank()} of {hvd.size()}")
    return hvd.rank(), hvd.size(), offset * scale, total.item()


@pytest.mark.parametrize("num_proc", [1, 2, 3])
def test_values_come_back_in_rank_order(num_proc, capfd):
    results = hora.run(_sum_of_ranks, args=(2,), kwargs={"scale": 5}, num_proc=num_proc)
    total = float(sum(range(num_proc)))
    assert results == [(rank, num_proc, 10, total) for rank in range(num_proc)]
    output = capfd.readouterr().out
    for rank in range(num_proc):
        assert f"[{rank}] rank {rank} of {num_proc}" in output


def _fails_on_rank_one():
    import hora.torch as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("no such key on rank one")
    hvd.barrier()
    return hvd.rank()


def test_a_rank_that_raises_ends_the_job_with_its_error():
    with pytest.raises(RuntimeError) as caught:
        hora.run(_fails_on_rank_one, num_proc=2)
    assert isinstance(caught.value, JobError) and caught.value.rank == 1
    assert "rank 1 (host" in str(caught.value) and "KeyError: 'no such key on rank one'" in \
        str(caught.value)


def _rank_in_elastic_state():
    import hora.torch as hvd
    hvd.init()
    state = hvd.elastic.ObjectState(steps=0)

    @hvd.elastic.run
    def train(state):
        state.steps += 1
        state.commit()
        return hvd.rank(), state.steps

    return train(state)


def test_an_elastic_job_and_horovods_deprecated_names(monkeypatch, tmp_path):
    monkeypatch.setenv("HORA_ELASTIC_STATE_DIR", str(tmp_path / "state"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = hora.run(_rank_in_elastic_state, np=2, min_np=2, max_np=2)
    assert results == [(0, 1), (1, 1)]
    assert sorted(str(w.message).split(" is ")[0] for w in caught
                  if issubclass(w.category, DeprecationWarning)) == ["max_np", "min_np", "np"]


def test_horovods_argument_checks():
    with pytest.raises(ValueError, match="hosts and hostfile only allow one"):
        hora.run(print, hosts="a:1", hostfile="h")
    with pytest.raises(ValueError, match="use_gloo and use_mpi only allow one"):
        hora.run(print, use_gloo=True, use_mpi=True)
    with pytest.raises(ValueError, match="hora has no Gloo controller"):
        hora.run(print, use_gloo=True)
    with pytest.raises(TypeError, match="func must be callable"):
        hora.run("train.py")
    assert hora.runner.run is hora.run
