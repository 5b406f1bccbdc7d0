"""The timeline: a known sequence of collectives leaves a valid Chrome-trace
file (written by rank 0) with every phase of every tensor, and the summarize
tool reads it."""

import json
import subprocess
import sys

import numpy as np

import hora
from hora.timeline import load_events, phase_of


def run_known_sequence(rank, size):
    x = np.ones(4, np.float32)
    hora.allreduce(x, name="tl.small", op=hora.Sum)
    hora.grouped_allreduce([np.ones(8, np.float32)] * 3, name="tl.group", op=hora.Sum)
    hora.allreduce(np.ones(1 << 18, np.float32), name="tl.big", op=hora.Sum)
    hora.allgather(np.full((1, 2), rank, np.int32), name="tl.gather")
    hora.broadcast(np.arange(3.0), 0, name="tl.bcast")
    hora.allreduce(x, name="tl.small", op=hora.Sum)  # again: answered by the cache


def spans_of(events, row):
    pids = {e["pid"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name" and e["args"]["name"] == row}
    assert len(pids) == 1, f"no single timeline row for {row!r}"
    return [e for e in events if e.get("pid") in pids and e.get("ph") != "M"]


def test_known_sequence_has_every_phase(tmp_path, rank, size):
    path = tmp_path / "timeline.json"
    hora.start_timeline(path, mark_cycles=True)
    # Only rank 0 writes: nobody starts the sequence before rank 0 records.
    hora.barrier()
    run_known_sequence(rank, size)
    hora.stop_timeline()
    hora.barrier()
    if rank != 0:
        assert not path.exists(), "only rank 0 writes the timeline"
        return
    events = json.loads(path.read_text())  # finished: strict JSON

    small = spans_of(events, "tl.small")
    begins = [e for e in small if e["ph"] == "B" and e["name"] == "NEGOTIATE_ALLREDUCE"]
    ends = [e for e in small if e["ph"] == "E" and e["name"] == "NEGOTIATE_ALLREDUCE"]
    assert len(begins) == len(ends) == 2, small
    readies = {e["args"]["rank"] for e in small if e["ph"] == "i" and e["name"].endswith(" ready")}
    assert readies == set(range(size)), readies
    names = [e["name"] for e in small if e["ph"] == "X"]
    assert names.count("QUEUE") == 2 and names.count("ALLREDUCE") == 2, names
    assert any(name.endswith("_ALLREDUCE") for name in names), names
    for e in small:
        if e["ph"] == "X":
            assert e["dur"] >= 0 and e["ts"] >= 0

    group = [spans_of(events, f"tl.group.{k}") for k in range(3)]
    for spans in group:
        top = [e for e in spans if e["ph"] == "X" and e["name"] == "ALLREDUCE"]
        assert len(top) == 1 and top[0]["args"]["tensors"] == 3, top  # fused into one batch

    big = [e["name"] for e in spans_of(events, "tl.big") if e["ph"] == "X"]
    assert any(phase_of(name) == "communicate" for name in big), big
    gather = [e["name"] for e in spans_of(events, "tl.gather") if e["ph"] == "X"]
    assert "ALLGATHER" in gather and "MPI_ALLGATHERV" in gather, gather
    bcast = [e["name"] for e in spans_of(events, "tl.bcast") if e["ph"] == "X"]
    assert "BROADCAST" in bcast and "MPI_BCAST" in bcast, bcast
    cycles = spans_of(events, "(engine cycles)")
    assert cycles and all(e["name"] == "CYCLE" for e in cycles)

    out = tmp_path / "steps.png"
    done = subprocess.run([sys.executable, "-m", "hora.timeline", "summarize", str(path),
                           "--plot", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for fragment in ("phase totals", "tl.small", "tl.group.0", "fusion:", "negotiate",
                     "communicate"):
        assert fragment in done.stdout, done.stdout
    if size > 1:
        assert "mean lag" in done.stdout, done.stdout
    assert out.stat().st_size > 1000


def test_restart_replaces_the_file_and_stop_twice_is_harmless(tmp_path, rank, size):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    hora.start_timeline(first)
    hora.barrier()
    hora.allreduce(np.ones(2), name="tl.first")
    hora.start_timeline(second)  # finishes the first file
    hora.barrier()
    hora.allreduce(np.ones(2), name="tl.second")
    hora.stop_timeline()
    hora.stop_timeline()
    if rank == 0:
        def rows(p):
            return {e["args"]["name"] for e in json.loads(p.read_text())
                    if e.get("name") == "process_name"}
        assert "tl.first" in rows(first) and "tl.second" not in rows(first)
        assert "tl.second" in rows(second)
        assert load_events(second) == json.loads(second.read_text())


def test_a_writer_that_falls_behind_drops_and_says_so_once(tmp_path, capfd, restart_hora, rank,
                                                           size):
    # A queue of 8 events cannot hold one cycle's worth: events are dropped,
    # reported once, and the file still loads.
    path = tmp_path / "dropping.json"
    restart_hora(HORA_TIMELINE_QUEUE_EVENTS=8)
    hora.start_timeline(path, mark_cycles=True)
    hora.barrier()
    for step in range(50):
        hora.grouped_allreduce([np.ones(4, np.float32)] * 6, name=f"drop.{step % 5}")
    hora.stop_timeline()
    if rank != 0:
        return
    err = capfd.readouterr().err
    assert err.count("timeline: the writer fell behind and dropped") == 1, err
    events = load_events(path)
    assert any(e.get("name") == "events dropped" for e in events)
    assert json.loads(path.read_text()) == events
