"""Examples that are not walked through by a getting-started page, run as
their users run them: the hybrid-parallel example on 4 ranks (2 pipeline
stages x 2 replicas with process sets) must train to the weights of a
single process on the global batch."""

import os
import pathlib
import re

import pytest

from launch import run_horarun

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_hybrid_parallel_example_matches_single_process_training():
    pytest.importorskip("torch")
    output = run_horarun(4, [str(ROOT / "examples" / "pytorch" / "hybrid_parallel.py"),
                             "--steps", "60"], dict(os.environ), ROOT)
    assert "hybrid training matches single-process training" in output, output[-5000:]
    losses = [float(x) for x in re.findall(r"step +\d+ +loss ([0-9.]+)", output)]
    assert len(losses) >= 2 and losses[-1] < losses[0], output[-5000:]


def run_sharded_example(tmp_path, *args):
    """(exit code, output) of examples/pytorch/sharded_transformer.py at 4 ranks."""
    import subprocess
    import sys
    script = str(ROOT / "examples" / "pytorch" / "sharded_transformer.py")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))
    job = subprocess.run([sys.executable, "-m", "hora.runner", "-np", "4", sys.executable, script,
                          "--steps", "14", *args], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    return job.returncode, job.stdout.decode(errors="replace")


def assert_trains(code, output):
    assert code == 0 and "trained within the limit" in output, output[-5000:]
    losses = [float(x) for x in re.findall(r"step +\d+ +loss ([0-9.]+)", output)]
    assert losses[-1] < losses[0] / 2, output[-5000:]


def assert_runs_out(code, output):
    assert code != 0, output[-5000:]
    assert "can't allocate memory" in output or "ran out of memory" in output, output[-5000:]


def test_sharded_example_trains_a_model_that_does_not_fit_replicated(tmp_path):
    """Under the example's enforced per-rank memory limit, sharding the
    gradients and Adam's state trains (the loss falls towards the chain's
    entropy); the same model replicated runs out of memory, with the
    allocator's error, on every rank it hits."""
    pytest.importorskip("torch")
    assert_trains(*run_sharded_example(tmp_path))
    assert_runs_out(*run_sharded_example(tmp_path, "--sharding", "none"))


def test_sharded_example_trains_with_sharded_weights_what_stage_2_cannot(tmp_path):
    """A deeper model (16 blocks, 41 M parameters) under the same limit:
    sharding="parameters" trains it and sharding="gradients" runs out."""
    pytest.importorskip("torch")
    assert_trains(*run_sharded_example(tmp_path, "--sharding", "parameters", "--layers", "16"))
    assert_runs_out(*run_sharded_example(tmp_path, "--sharding", "gradients", "--layers", "16"))
