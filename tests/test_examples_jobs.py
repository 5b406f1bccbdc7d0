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
