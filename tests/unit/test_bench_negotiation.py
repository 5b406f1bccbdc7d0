"""python -m hora.bench negotiation: a small simulation runs the real
negotiation on thread-ranks, and the cost model follows its formulas."""
import json
import math
import subprocess
import sys

import pytest

from hora.bench import negotiation


def test_simulated_ranks_negotiate_every_step_in_one_cycle(tmp_path):
    out = tmp_path / "negotiation.json"
    job = subprocess.run(
        [sys.executable, "-m", "hora.bench", "negotiation", "--ranks", "2,33", "--tensors",
         "20", "--steps", "3", "--model-ranks", "64", "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [row["ranks"] for row in result["measured"]] == [2, 33]
    for row in result["measured"]:
        assert row["cycles_per_step"] == 1
        # the first step goes through the coordinator, later ones hit the cache
        assert row["first_step_coordinator_cpu_s"] > row["cached_coordinator_cpu_s"] > 0
    assert result["model"][0]["ranks"] == 64
    assert "eff. no overlap" in job.stdout


def test_cost_model_formulas():
    args = negotiation.parse(["--ranks", "8", "--latency-us", "10", "--link-gbps", "80",
                              "--gradient-mib", "100", "--compute-ms", "300",
                              "--ranks-per-host", "1", "--fusion-mib", "64",
                              "--cycles-per-step", "2"])
    p = negotiation.predict(args, 16, 50e-6)
    assert p["cycle_s"] == pytest.approx(50e-6 + 2 * 4 * 10e-6)
    assert p["ring_bandwidth_s"] == pytest.approx(2 * 15 / 16 * 100 * 2**20 / 10e9)
    assert p["ring_latency_s"] == pytest.approx(2 * 15 * 10e-6 * math.ceil(100 / 64))
    total = 2 * p["cycle_s"] + p["ring_bandwidth_s"] + p["ring_latency_s"]
    assert p["communication_s"] == pytest.approx(total)
    assert p["efficiency_no_overlap"] == pytest.approx(0.3 / (0.3 + total))
    assert p["efficiency_overlapped"] == 1.0  # 0.2 s of backward hides it all


def test_bad_arguments_are_refused():
    with pytest.raises(SystemExit):
        negotiation.parse(["--ranks", "1,8"])
    with pytest.raises(SystemExit):
        negotiation.parse(["--ranks", "eight"])
