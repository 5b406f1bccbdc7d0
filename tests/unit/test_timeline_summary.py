"""hora.timeline on hand-made trace events: phases, lag, fusion, steps, and
files cut short."""
import json

import pytest

from hora.timeline import load_events, phase_of, steps, summarize


def meta(pid, name):
    return {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}


def x(pid, name, ts, dur, **args):
    event = {"name": name, "ph": "X", "pid": pid, "tid": 0, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def mark(pid, ts, rank):
    return {"name": f"rank {rank} ready", "ph": "i", "pid": pid, "tid": 0, "ts": ts, "s": "p",
            "args": {"rank": rank}}


def job():
    events = [meta(1, "a"), meta(2, "b")]
    # Step 1: a and b negotiate, rank 2 late on both; fused into one batch.
    for pid in (1, 2):
        events += [{"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": pid, "tid": 0, "ts": 0},
                   mark(pid, 0, 0), mark(pid, 10, 1), mark(pid, 100, 2),
                   {"name": "NEGOTIATE_ALLREDUCE", "ph": "E", "pid": pid, "tid": 0, "ts": 100},
                   x(pid, "QUEUE", 100, 20),
                   x(pid, "ALLREDUCE", 120, 80, bytes=2048, tensors=2, first="a"),
                   x(pid, "MEMCPY_IN_FUSION_BUFFER", 120, 10),
                   x(pid, "SHM_ALLREDUCE", 130, 60),
                   x(pid, "MEMCPY_OUT_FUSION_BUFFER", 190, 10)]
    # Step 2, 50 ms later: a alone, answered from the cache (rank 0 only).
    events += [{"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "pid": 1, "tid": 0, "ts": 50000},
               mark(1, 50000, 0),
               {"name": "NEGOTIATE_ALLREDUCE", "ph": "E", "pid": 1, "tid": 0, "ts": 50005},
               x(1, "QUEUE", 50005, 1),
               x(1, "ALLREDUCE", 50006, 30, bytes=1024, tensors=1, first="a"),
               x(1, "MPI_ALLREDUCE", 50006, 30)]
    return events


def test_phase_names():
    assert phase_of("NEGOTIATE_ALLGATHER") == "negotiate"
    assert phase_of("QUEUE") == "wait"
    assert phase_of("MEMCPY_OUT_FUSION_BUFFER") == "copy"
    assert phase_of("RING_ALLREDUCE") == phase_of("MPI_BCAST") == "communicate"
    assert phase_of("ALLREDUCE") is None


def test_summary():
    s = summarize(job())
    assert s.tensors["a"]["runs"] == 2 and s.tensors["b"]["runs"] == 1
    assert s.tensors["a"]["negotiate"] == 105 and s.tensors["a"]["communicate"] == 90
    # Fused tensors share their time: phases count wall time once.
    assert s.phase_totals == {"negotiate": 105, "wait": 21, "copy": 20, "communicate": 90}
    assert s.rank_lag[2] == {"mean_us": 100, "last": 2, "seen": 2}
    assert s.rank_lag[0]["mean_us"] == 0 and s.rank_lag[1]["mean_us"] == 10
    assert s.fusion["batches"] == 2 and s.fusion["fused_batches"] == 1
    assert s.fusion["max_tensors"] == 2 and s.fusion["tensors"] == 3
    assert not s.dropped


def test_steps_split_at_gaps():
    rows = steps(job(), gap_us=5000)
    assert len(rows) == 2
    assert rows[0]["negotiate"] == 100 and rows[0]["communicate"] == 60
    assert rows[1]["start_us"] == 50000 and rows[1]["communicate"] == 30
    # Without the gap, step 1 ends where tensor a comes again.
    assert [r["start_us"] for r in steps(job(), gap_us=10 ** 9)] == [0, 50000]


def test_steps_split_where_a_tensor_comes_again_without_a_gap():
    # Three steps of a small model back to back: each runs a and b once,
    # 1 ms after the last, with no gap longer than the default 5 ms.
    events = [meta(1, "a"), meta(2, "b")]
    for step in range(3):
        t = step * 1000
        for pid in (1, 2):
            events += [x(pid, "NEGOTIATE_ALLREDUCE", t, 100), x(pid, "QUEUE", t + 100, 10),
                       x(pid, "ALLREDUCE", t + 110, 50), x(pid, "SHM_ALLREDUCE", t + 110, 50)]
    rows = steps(events)
    assert [r["start_us"] for r in rows] == [0, 1000, 2000]
    assert all(r["negotiate"] == 100 and r["communicate"] == 50 for r in rows)


@pytest.mark.parametrize("cut", ["closed", "no bracket", "trailing comma", "half a line"])
def test_files_cut_short_still_load(tmp_path, cut):
    events = job()
    lines = [json.dumps(e) for e in events]
    text = {"closed": "[\n" + ",\n".join(lines) + "\n]\n",
            "no bracket": "[\n" + ",\n".join(lines),
            "trailing comma": "[\n" + ",\n".join(lines) + ",\n",
            "half a line": "[\n" + ",\n".join(lines) + ",\n" + lines[0][:20]}[cut]
    path = tmp_path / "t.json"
    path.write_text(text)
    assert load_events(path) == events


def test_not_a_timeline(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("hello")
    with pytest.raises(ValueError, match="not a hora timeline"):
        load_events(path)


def test_summarize_prints_whole_tensor_names(tmp_path, capsys):
    from hora.timeline.__main__ import main
    names = [f"allreduce.bucket.fc2.bias..conv1.weight.10.{i}" for i in range(2)]
    events = [meta(1, names[0]), meta(2, names[1])]
    for pid in (1, 2):
        events += [x(pid, "NEGOTIATE_ALLREDUCE", 0, 100), x(pid, "ALLREDUCE", 100, 50),
                   x(pid, "SHM_ALLREDUCE", 100, 50)]
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(events))
    assert main(["summarize", str(path)]) == 0
    printed = capsys.readouterr().out
    assert all(f"  {name}  " in printed for name in names)
