"""python -m hora.bench elastic: what elastic training costs.

recovery: a 2-rank elastic PyTorch job under horarun (a small MLP; PyTorch
    imported by every new rank) loses rank 1 to SIGKILL at a fixed step;
    reported is the time from the kill to the first training step of the
    next world, and how that splits into horarun noticing, the relaunch up
    to ``hora.init()`` returning, and restoring the commit.
commit: ``state.commit()`` of a TorchState whose model has N MB of float32
    parameters (plus as much SGD momentum), in one process: the time the
    training thread spends in commit(), and how long the background write
    of that commit to disk takes.

Runs without a launcher: it starts the recovery job itself.
    python -m hora.bench elastic [--sizes-mb 1,10,100] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = os.path.join(os.path.dirname(__file__), "elastic_worker.py")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hora.bench elastic",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="1,10,100",
                        help="commit: model sizes in MB of parameters (default 1,10,100)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="recovery: jobs to run; commit: commits per size (default 3)")
    parser.add_argument("--skip-recovery", action="store_true",
                        help="measure the cost of commit() only")
    parser.add_argument("--json", help="write the results to this file")
    return parser


def measure_recovery(repeats: int) -> list[dict]:
    rows = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="hora-bench-elastic-") as folder:
            env = dict(os.environ, HORA_ELASTIC_STATE_DIR=os.path.join(folder, "state"),
                       HORA_BENCH_KILL_STEP="30")
            done = subprocess.run(
                [sys.executable, "-m", "hora.runner", "-np", "2", "--min-np", "2",
                 sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=300,
                check=False)
        output = done.stdout + done.stderr
        if done.returncode != 0:
            raise RuntimeError(f"the recovery job failed:\n{output[-4000:]}")
        events = {m.group(1): float(m.group(2))
                  for m in re.finditer(r"bench-elastic (\w+) ([0-9.]+)", output)}
        noticed = re.search(r"horarun: elastic reset 1", output)
        if not noticed or "killed" not in events or "first_step" not in events:
            raise RuntimeError(f"the recovery job did not report its events:\n{output[-4000:]}")
        rows.append({
            "kill_to_first_step_s": events["first_step"] - events["killed"],
            "kill_to_init_s": events["initialized"] - events["killed"],
            "restore_s": events["restored"] - events["initialized"],
        })
        print(f"  recovery: {rows[-1]['kill_to_first_step_s']:.2f} s from SIGKILL to the first "
              f"step of the next world ({rows[-1]['kill_to_init_s']:.2f} s to hora.init(), "
              f"{rows[-1]['restore_s']:.2f} s restoring)", flush=True)
    return rows


def measure_commit(sizes_mb: list[float], repeats: int) -> list[dict]:
    import torch

    import hora.torch as hvd
    from hora.common.elastic.store import CommitStore
    hvd.init()
    rows = []
    for size_mb in sizes_mb:
        width = int((size_mb * 2**20 / 4) ** 0.5)
        model = torch.nn.Linear(width, width, bias=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(1, width)).sum().backward()
        optimizer.step()  # momentum buffers exist, as in training
        state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0)
        with tempfile.TemporaryDirectory(prefix="hora-bench-commit-") as folder:
            store = CommitStore(folder, writer=True)
            state._store = store
            in_commit, in_write = [], []
            for _ in range(repeats):
                start = time.perf_counter()
                state.commit()
                returned = time.perf_counter()
                store.flush()
                written = time.perf_counter()
                in_commit.append(returned - start)
                in_write.append(written - start)
            file_mb = os.path.getsize(store.path) / 2**20
        rows.append({"parameters_mb": width * width * 4 / 2**20, "file_mb": file_mb,
                     "commit_s": statistics.median(in_commit),
                     "until_written_s": statistics.median(in_write)})
        print(f"  commit: {rows[-1]['parameters_mb']:7.1f} MB of parameters "
              f"({file_mb:.0f} MB on disk): {rows[-1]['commit_s'] * 1e3:7.1f} ms in commit(), "
              f"written after {rows[-1]['until_written_s'] * 1e3:7.1f} ms", flush=True)
    hvd.shutdown()
    return rows


def main(argv=None):
    args = build_parser().parse_args(argv)
    results = {"benchmark": "elastic"}
    if not args.skip_recovery:
        print("# elastic recovery: 2 ranks, rank 1 SIGKILLed at step 30", flush=True)
        results["recovery"] = measure_recovery(args.repeats)
        median = statistics.median(r["kill_to_first_step_s"] for r in results["recovery"])
        print(f"  median: {median:.2f} s", flush=True)
    print("# elastic commit cost (one process)", flush=True)
    results["commit"] = measure_commit([float(s) for s in args.sizes_mb.split(",")],
                                       args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
