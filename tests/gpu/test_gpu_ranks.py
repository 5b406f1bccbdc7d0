"""Several ranks with GPU tensors, under horarun: two ranks on one GPU get
an error that names them (on every rank, no hang); with two or more GPUs,
a 2-rank job reduces correctly across them."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import hora.torch as hvd

SCRIPT = textwrap.dedent("""
    import os, sys, torch
    import hora.torch as hvd
    hvd.init()
    device = int(sys.argv[1]) if sys.argv[1] != "local" else hvd.local_rank()
    torch.cuda.set_device(device)
    x = torch.full((1000,), float(hvd.rank() + 1), device="cuda")
    try:
        out = hvd.allreduce(x, op=hvd.Sum, name="x")
        g = hvd.allgather(torch.full((hvd.rank() + 1, 2), float(hvd.rank()), device="cuda"),
                          name="g")
    except Exception as error:
        print(f"rank {hvd.rank()} error: {type(error).__name__}: {error}", flush=True)
        sys.exit(3)
    n = hvd.size()
    assert torch.all(out == n * (n + 1) / 2).item(), out
    assert g.shape[0] == n * (n + 1) // 2, g.shape
    print(f"rank {hvd.rank()} ok", flush=True)
""")


def run_job(tmp_path, world_size, device_arg):
    script = tmp_path / "gpu_job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.run([sys.executable, "-m", "hora.runner", "-np", str(world_size),
                           sys.executable, str(script), device_arg],
                          env=env, capture_output=True, text=True, timeout=300)


def test_two_ranks_on_one_gpu_are_named_on_every_rank(tmp_path):
    if not hvd.cuda_built():
        pytest.skip("needs a CUDA build (staging shares a GPU without NCCL)")
    job = run_job(tmp_path, 2, "0")
    output = job.stdout + job.stderr
    assert job.returncode != 0, output
    for rank in (0, 1):
        assert f"rank {rank} error" in output, output
    assert "ranks 0 and 1 on one host both use the same GPU" in output, output


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_on_two_gpus(tmp_path):
    job = run_job(tmp_path, 2, "local")
    output = job.stdout + job.stderr
    assert job.returncode == 0, output
    assert "rank 0 ok" in output and "rank 1 ok" in output
