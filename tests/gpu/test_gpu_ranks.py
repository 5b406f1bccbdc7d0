"""Several ranks with GPU tensors, under horarun. NCCL refuses two ranks on
one GPU, so ranks of a host with fewer GPUs than ranks run their GPU
collectives through host memory (HORA_SHARED_GPU=auto, the default): at 2
and 4 ranks on one GPU every collective and a training run must be right and
leave the ranks' parameters identical; with HORA_SHARED_GPU=error every rank
gets an error that names the ranks. With two or more GPUs the same job runs
over NCCL, a GPU per rank, and ranks left on one GPU there fail (the rule is
tested without a GPU in tests/cpp/test_shared_gpu.cc)."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import hora.torch as hvd

JOB = Path(__file__).resolve().parent / "shared_gpu_job.py"


def run_job(world_size, *args, timeout=300, **env_vars):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(env_vars)
    return subprocess.run([sys.executable, "-m", "hora.runner", "-np", str(world_size),
                           sys.executable, *args],
                          env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def cuda_build():
    if not hvd.cuda_built():
        pytest.skip("needs a CUDA build (without one, hora.torch stages every GPU tensor "
                    "through host memory in Python; tests/gpu/test_gpu_ops.py covers that)")


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="about machines with one GPU")
@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_sharing_one_gpu_stage_through_host_memory(world_size):
    job = run_job(world_size, str(JOB), timeout=120)
    output = job.stdout + job.stderr
    assert job.returncode == 0, output
    for rank in range(world_size):
        assert f"rank {rank} ok" in output, output
    # rank 0 says once why the job is slow, naming two ranks that share
    assert output.count("which NCCL does not allow") == 1, output
    assert "ranks 0 and 1 on one host both use the same GPU" in output, output


def test_ranks_sharing_one_gpu_fail_on_every_rank_when_asked(tmp_path):
    job = run_job(2, str(JOB), timeout=120, HORA_SHARED_GPU="error")
    output = job.stdout + job.stderr
    assert job.returncode != 0, output
    for rank in (0, 1):
        assert f"rank {rank} error" in output, output
    assert "ranks 0 and 1 on one host both use the same GPU" in output, output
    assert "NCCL needs a GPU per rank" in output, output


NCCL_TWO_ON_ONE = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(comm.bcast(29517 + os.getpid() % 1000, root=0))
    torch.cuda.set_device(0)
    try:
        dist.init_process_group("nccl", rank=comm.Get_rank(), world_size=comm.Get_size())
        x = torch.ones(4, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        print(f"rank {comm.Get_rank()} nccl allowed it: {x.tolist()}", flush=True)
    except Exception as error:
        print(f"rank {comm.Get_rank()} nccl refused: {type(error).__name__}: {error}", flush=True)
""")


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="about machines with one GPU")
def test_nccl_itself_refuses_two_ranks_on_one_gpu(tmp_path):
    """Why the staging exists: if a future NCCL accepts it, this says so."""
    script = tmp_path / "nccl_two_on_one.py"
    script.write_text(NCCL_TWO_ON_ONE)
    job = run_job(2, str(script), timeout=90, NCCL_DEBUG="WARN")
    output = job.stdout + job.stderr
    print(output[-3000:])
    assert "nccl refused" in output and "nccl allowed" not in output, output


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_on_two_gpus_use_nccl():
    job = run_job(2, str(JOB), "--own-gpu")
    output = job.stdout + job.stderr
    assert job.returncode == 0, output
    assert "rank 0 ok" in output and "rank 1 ok" in output, output
    assert "which NCCL does not allow" not in output, output
