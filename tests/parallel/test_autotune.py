"""Autotuning: rank 0 searches fusion thresholds and cycle times on a toy
workload, settles on the best setting it measured, and every rank applies
every change on the same cycle. Settings given explicitly stay fixed."""

import csv
import os
import time

import numpy as np

import hora
from hora._loader import _C

MiB = 1 << 20


def train_until_settled(rank, limit_s=60):
    """A toy step (8 gradients of 256 KiB, grouped) until rank 0's search
    settles; every rank stops on the same step."""
    grads = [np.full(1 << 16, rank, np.float32) for _ in range(8)]
    began = time.monotonic()
    step = 0
    while True:
        out = hora.grouped_allreduce(grads, name="toy.grads", op=hora.Sum)
        assert float(out[0][0]) == sum(range(hora.size()))
        step += 1
        if step % 10 == 0:
            searching = _C.engine_parameters()["autotuning"] if rank == 0 else None
            if not hora.broadcast_object(searching and time.monotonic() - began < limit_s,
                                         root_rank=0, name="toy.searching"):
                return step


def test_search_settles_and_every_rank_agrees(restart_hora, tmp_path, rank, size):
    log = tmp_path / "autotune.csv"
    restart_hora(HORA_AUTOTUNE=1, HORA_AUTOTUNE_SAMPLE_SECONDS=0.05,
                 HORA_AUTOTUNE_WARMUP_SAMPLES=1, HORA_AUTOTUNE_LOG=log)
    train_until_settled(rank)
    state = _C.engine_parameters()
    histories = hora.allgather_object(state["history"], name="toy.history")
    assert all(h == histories[0] for h in histories), "ranks applied different settings"
    assert len(histories[0]) >= 8, histories[0]  # every threshold was tried
    if rank != 0:
        return
    assert not state["autotuning"]
    rows = list(csv.DictReader(log.open()))
    stages = [row["stage"] for row in rows]
    assert stages[0] == "warmup" and stages.count("fusion_threshold") == 8, stages
    assert stages.count("cycle_time") == 5 and stages.count("confirm") == 2, stages
    # The switches: the response cache off (and, on several hosts with the
    # automatic choice, a flat ring instead of the hierarchical allreduce).
    switches = [row for row in rows if row["stage"] == "switches"]
    assert any(row["response_cache"] == "0" for row in switches), switches
    multi_host = hora.cross_size() > 1 and hora.local_size() > 1 and \
        os.environ.get("HORA_ALLREDUCE_ALGORITHM", "auto") == "auto"
    assert any(row["hierarchical"] == "0" for row in switches) == multi_host, switches
    assert all(float(row["score_bytes_per_second"]) > 0 for row in rows)
    key = lambda row: (int(row["fusion_threshold_bytes"]), float(row["cycle_time_ms"]),  # noqa: E731
                       row["response_cache"] == "1", row["hierarchical"] == "1")
    confirm = {key(row): float(row["score_bytes_per_second"]) for row in rows
               if row["stage"] == "confirm"}
    # Only the two re-measured finalists can win, on the mean of their samples.
    scored = []
    for row in rows:
        if row["stage"] in ("fusion_threshold", "cycle_time", "switches") and key(row) in confirm:
            score = (float(row["score_bytes_per_second"]) + confirm[key(row)]) / 2
            scored.append((score, key(row)))
    best = max(scored)[1]
    assert (state["fusion_threshold_bytes"], state["cycle_time_ms"], state["response_cache"],
            state["hierarchical"]) == best, (state, scored)


def test_explicit_setting_is_held(restart_hora, rank, size):
    restart_hora(HORA_AUTOTUNE=1, HORA_AUTOTUNE_SAMPLE_SECONDS=0.05,
                 HORA_AUTOTUNE_WARMUP_SAMPLES=0, HORA_FUSION_THRESHOLD_BYTES=4 * MiB)
    train_until_settled(rank)
    history = _C.engine_parameters()["history"]
    assert history, "the cycle time was never tuned"
    assert {change[1] for change in history} == {4 * MiB}
    assert {change[2] for change in history} >= {0.0, 0.5, 1.0, 2.5, 5.0}
