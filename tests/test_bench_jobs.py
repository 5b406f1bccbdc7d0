"""python -m hora.bench under horarun: every benchmark runs end to end on
real ranks, its JSON holds a row per implementation and size, and the
``#wrong`` check of every sweep finds nothing wrong. Timings are printed,
never asserted (speed is shown by running the benchmark, not by tests)."""

import json
import os
import pathlib

import pytest

from launch import run_horarun

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_bench(world_size, args, tmp_path):
    out = tmp_path / "out.json"
    output = run_horarun(world_size, ["-m", "hora.bench", *args, "--json", str(out)],
                         dict(os.environ), ROOT)
    return json.loads(out.read_text()), output


def expected_impls():
    names = ["hora", "mpi"]
    try:
        import torch.distributed  # noqa: F401
        names.append("gloo")
    except ImportError:
        pass
    return names


@pytest.mark.parametrize("world_size,collective", [
    (2, "allreduce"), (3, "allreduce"), (2, "allgather"), (3, "broadcast"),
    (3, "reducescatter"), (2, "alltoall")])
def test_sweep_checks_every_size_of_every_implementation(world_size, collective, tmp_path):
    impls = expected_impls()
    result, output = run_bench(world_size, [collective, "--min-bytes", "8", "--max-bytes", "262144",
                                            "--compare", ",".join(impls[1:])], tmp_path)
    assert result["ranks"] == world_size
    rows = result["rows"]
    # 8 B up to 256 KiB in steps of x4: 8, 32, ..., 131072
    sizes = {r["size"] for r in rows}
    assert len(sizes) == 8, output
    if collective in ("reducescatter", "alltoall"):
        impls = [i for i in impls if i != "gloo"]  # gloo has neither on CPU
    for impl in impls:
        mine = [r for r in rows if r["impl"] == impl]
        assert len(mine) == len(sizes), f"{impl} is missing sizes:\n{output}"
        for row in mine:
            assert row["wrong"] == 0, f"{impl} got {row['wrong']} wrong elements at {row['size']} B"
            assert row["busbw"] > 0 and row["time_us"] > 0
            assert row["collective"] == collective and row["ranks"] == world_size


def test_fusion_latency_and_idle_report_every_implementation(tmp_path):
    impls = expected_impls()
    compare = ",".join(impls[1:])
    fusion, _ = run_bench(2, ["fusion", "--iterations", "3", "--compare", compare], tmp_path)
    assert [r["impl"] for r in fusion["rows"]] == impls
    for row in fusion["rows"]:
        assert row["tensors_ms"] > 0 and row["concatenated_ms"] > 0
        assert row["ratio"] == pytest.approx(row["tensors_ms"] / row["concatenated_ms"])

    latency, _ = run_bench(2, ["latency", "--iterations", "50", "--compare", compare], tmp_path)
    assert [r["impl"] for r in latency["rows"]] == impls
    for row in latency["rows"]:
        assert 0 < row["p50_us"] <= row["p99_us"]

    idle, output = run_bench(2, ["idle", "--seconds", "1"], tmp_path)
    assert [(r["impl"], r["rank"]) for r in idle["rows"]] == [("hora", 0), ("hora", 1)]
    assert all(r["idle_cpu_percent"] >= 0 for r in idle["rows"]), output


def test_sweep_and_latency_inside_process_sets(tmp_path):
    sweep, output = run_bench(3, ["allreduce", "--max-bytes", "65536", "--process-set", "1,2",
                                  "--compare", "mpi"], tmp_path)
    assert sweep["ranks"] == 2, output  # measured among the set's two ranks
    assert {r["impl"] for r in sweep["rows"]} == {"hora", "mpi"}
    assert all(r["wrong"] == 0 and r["ranks"] == 2 for r in sweep["rows"]), output
    latency, output = run_bench(3, ["latency", "--iterations", "60", "--idle-set", "0,1",
                                    "--compare", "mpi"], tmp_path)
    assert [r["impl"] for r in latency["rows"]] == ["hora", "mpi", "no set", "idle set"], output
    for row in latency["rows"]:
        assert 0 < row["p50_us"] <= row["p99_us"]
    busy, output = run_bench(4, ["latency", "--iterations", "60", "--process-set", "2,3",
                                 "--busy-set", "0,1", "--busy-bytes", "65536", "--compare", ""],
                             tmp_path)
    assert [r["impl"] for r in busy["rows"]] == ["hora"] and busy["ranks"] == 2, output
    assert "the busy set ran" in output, output


def test_idle_beside_a_busy_set_splits_each_rank_by_thread(tmp_path):
    idle, output = run_bench(3, ["idle", "--busy-set", "0,1", "--seconds", "1"], tmp_path)
    rows = idle["rows"]
    assert [(r["rank"], r["role"]) for r in rows] == [
        (0, "busy set"), (1, "busy set"), (2, "idle")], output
    for row in rows:
        parts = [row[f"{k}_cpu_percent"] for k in ("main", "job_threads", "set_threads")]
        assert all(p >= 0 for p in parts), output
    # the busy ranks' set engines did the set's allreduces; the idle rank
    # is in no set but the job's
    assert all(r["set_threads_cpu_percent"] > 0 for r in rows[:2]), output
    assert rows[2]["set_threads_cpu_percent"] == 0, output


class FakeImpl:
    def __init__(self, name, background, log):
        self.name, self.background, self.log = name, background, log

    def start(self):
        self.log.append(f"start {self.name}")

    def stop(self):
        self.log.append(f"stop {self.name}")


def test_background_implementations_run_alone_between_start_and_stop():
    from hora.bench import implementations
    log = []
    impls = [FakeImpl("hora", False, log), FakeImpl("horovod", True, log),
             FakeImpl("mpi", False, log)]
    for group in implementations.phases(impls):
        with implementations.started(group):
            log.append("measure " + "+".join(i.name for i in group))
    assert log == ["start hora", "start mpi", "measure hora+mpi", "stop mpi", "stop hora",
                   "start horovod", "measure horovod", "stop horovod"]


def test_a_failed_measurement_still_stops_what_started():
    from hora.bench import implementations
    log = []

    class FailsToStart(FakeImpl):
        def start(self):
            raise RuntimeError("no MPI")

    group = [FakeImpl("gloo", False, log), FailsToStart("horovod", False, log)]
    with pytest.raises(RuntimeError, match="no MPI"):
        with implementations.started(group):
            log.append("measured")
    assert log == ["start gloo", "stop gloo"]
    with pytest.raises(ValueError):
        with implementations.started([FakeImpl("gloo", False, log)]):
            raise ValueError("a collective failed")
    assert log[-1] == "stop gloo"


def test_sharding_benchmark_measures_memory_speed_and_the_largest_model(tmp_path):
    """python -m hora.bench sharding at 2 ranks with a small transformer:
    every variant's state, gradients and peak memory, its samples/sec, the
    weights it ends with, and the largest model within a limit."""
    pytest.importorskip("torch")
    result, output = run_bench(2, ["sharding", "--measure", "memory,throughput,largest",
                                   "--compare", "ddp_zero,fsdp2", "--width", "64",
                                   "--layers", "2", "--vocabulary", "512", "--sequence", "16",
                                   "--num-iters", "2", "--num-batches-per-iter", "2",
                                   "--num-warmup-batches", "1", "--limit-mib", "24",
                                   "--max-layers", "8"], tmp_path)
    memory = result["memory"]
    assert set(memory) == {"hora", "hora_zero1", "hora_zero2", "hora_zero3", "ddp_zero",
                           "fsdp2"}, output
    for name in ("hora_zero1", "hora_zero2", "hora_zero3", "fsdp2"):
        assert memory[name]["ratio_to_replicated"]["state_bytes"] == pytest.approx(0.5, abs=0.05)
    for name in ("hora_zero2", "hora_zero3"):
        assert memory[name]["ratio_to_replicated"]["gradient_bytes"] == pytest.approx(
            0.5, abs=0.05)
    assert set(result["variants"]) >= {"hora", "compute_only", "hora_zero1", "hora_zero2",
                                       "hora_zero3", "ddp_zero", "fsdp2"}, output
    # two ranks add in one order only: every variant ends with hora's weights
    for name, agreement in result["weight_difference_to_hora"].items():
        assert agreement["largest"] == 0.0, (name, output)
    largest = result["largest"]
    assert largest["hora_zero2"]["layers"] >= largest["hora"]["layers"] >= 1, output
    assert largest["hora_zero3"]["layers"] >= largest["hora"]["layers"], output


def test_host_cost_times_and_checks_every_variant(tmp_path):
    pytest.importorskip("torch")
    result, output = run_bench(2, ["host-cost", "--shapes", "tiny", "--iterations", "5",
                                   "--compare", "gloo"], tmp_path)
    rows = result["rows"]
    assert [r["variant"] for r in rows] == ["flat", "flat_", "grouped", "grouped_", "async",
                                            "gloo flat_", "gloo async"], output
    for row in rows:
        assert row["wrong"] == 0 and row["us"] > 0, (row, output)
        assert row["tensors"] == 161 and row["ranks"] == 2
        assert (row["reference"] is None) == (row["us_per_tensor_above"] is None)
