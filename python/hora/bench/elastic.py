"""python -m hora.bench elastic: what elastic training costs.

recovery: an elastic PyTorch job under horarun (a small MLP) loses its
    last rank to SIGKILL at a fixed step; reported is the time from the kill
    to the first training step of the next world. Relaunched (the default
    mode; 2 ranks, PyTorch imported again by every new rank), it splits into
    the relaunch up to ``hora.init()`` returning and restoring the commit;
    in place (``--elastic-in-place --no-replace``; 2, 3 and 4 ranks; over
    MPI, and over hora's own TCP transport with ``in-place-tcp``) into
    detecting the loss and re-forming the world (until the reset callbacks
    run), and syncing the state with the redone step. Sharded (``sharded``:
    Adam's state sharded, ``sharding="gradients"``, in place without
    replacement; 2, 3 and 4 ranks; killed 5 steps after a commit): the same
    split, the survivors going back to that commit from their parts and the
    buddy copy of the lost rank's, and the mean time of a ``commit()``
    (which copies each rank's part to the next rank). With a replacement
    (``--elastic-in-place``, 3 ranks, steps slowed to 30 ms so that the job
    outlasts the replacement's start): the time from the replacement
    process's start to its first step in the world, and the survivors'
    pause (from the commit at which it joins to their next step). Grown
    (``grow``: ``--elastic-in-place`` with a discovery script, 2 ranks, 30 ms
    steps): at a fixed step rank 0 adds a slot to the script's list; the
    time from then to the new process's first step in the world, from its
    start to that step, and the ranks' pause. Left (``leave``: in place with
    a discovery script, 30 ms steps, 2, 3 and 4 ranks; ``leave-relaunch``:
    the same job relaunched, 3 ranks): at a fixed step rank 0 lists one slot
    fewer; the time from then to the first step of the world without the
    last rank, and in place the ranks' pause (from the commit at which it
    left to their next step).
churn (``--churn``): a 3-rank job (50 ms steps) trains for ``--churn-seconds``
    while the bench SIGKILLs one of its training processes (any, rank 0
    included) every ``--kill-every`` seconds; reported is the training that
    counts (samples, less what a relaunch rolls back) against the same job
    without kills: in place with replacements (over MPI, and over hora's own
    TCP transport), and relaunched.
commit: ``state.commit()`` of a TorchState whose model has N MB of float32
    parameters (plus as much SGD momentum), in one process: the time the
    training thread spends in commit(), and how long the background write
    of that commit to disk takes.

Runs without a launcher: it starts the recovery job itself.
    python -m hora.bench elastic [--sizes-mb 1,10,100] [--repeats 3] [--cuda] [--json out.json]

With ``--cuda`` the recovery and churn jobs train on the GPU (each rank on
its local rank's; ranks sharing one GPU stage their collectives through
host memory, as hora does for any such job).
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
from typing import Any

WORKER = os.path.join(os.path.dirname(__file__), "elastic_worker.py")
_CUDA = False  # --cuda: the jobs' workers train on the GPU


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hora.bench elastic",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mb", default="1,10,100",
                        help="commit: model sizes in MB of parameters (default 1,10,100)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="recovery: jobs to run; commit: commits per size (default 3)")
    parser.add_argument("--modes",
                        default="relaunch,in-place,in-place-tcp,sharded,replace,grow,leave,"
                                "leave-relaunch",
                        help="recovery: relaunch, in-place, in-place-tcp, sharded, replace, "
                             "grow, leave and/or leave-relaunch (default all)")
    parser.add_argument("--ranks", default="2,3,4",
                        help="recovery in place: world sizes (default 2,3,4)")
    parser.add_argument("--churn", action="store_true",
                        help="also measure efficiency under repeated kills (several minutes)")
    parser.add_argument("--churn-seconds", type=float, default=180.0,
                        help="churn: how long each job trains (default 180)")
    parser.add_argument("--kill-every", type=float, default=20.0,
                        help="churn: seconds between kills (default 20)")
    parser.add_argument("--skip-recovery", action="store_true",
                        help="measure the cost of commit() only")
    parser.add_argument("--cuda", action="store_true",
                        help="recovery and churn: the jobs train on the GPU")
    parser.add_argument("--json", help="write the results to this file")
    return parser


def _recovery_job(ranks: int, mode: str, folder: str) -> dict[str, float]:
    in_place = mode not in ("relaunch", "leave-relaunch")
    env = dict(os.environ, HORA_ELASTIC_STATE_DIR=os.path.join(folder, "state"),
               HORA_BENCH_KILL_STEP="30", HORA_BENCH_CUDA="1" if _CUDA else "0")
    extra = {"relaunch": [], "in-place": ["--elastic-in-place", "--no-replace"],
             "in-place-tcp": ["--elastic-in-place", "--no-replace", "--transport", "tcp"],
             "sharded": ["--elastic-in-place", "--no-replace"],
             "replace": ["--elastic-in-place"], "grow": ["--elastic-in-place"],
             "leave": ["--elastic-in-place"], "leave-relaunch": []}[mode]
    if mode == "sharded":  # 5 steps after the last commit: those are redone
        env.update(HORA_BENCH_SHARDING="gradients", HORA_BENCH_KILL_STEP="35")
    if mode in ("replace", "grow", "leave", "leave-relaunch"):
        env.update(HORA_BENCH_STEPS="300", HORA_BENCH_STEP_SLEEP="0.03")
    if mode in ("grow", "leave", "leave-relaunch"):
        hosts = os.path.join(folder, "hosts")
        with open(hosts, "w") as f:
            f.write(f"localhost:{ranks}\n")
        script = os.path.join(folder, "discover.sh")
        with open(script, "w") as f:
            f.write(f"#!/bin/sh\ncat {hosts}\n")
        os.chmod(script, 0o755)
        env["HORA_BENCH_GROW_FILE" if mode == "grow" else "HORA_BENCH_LEAVE_FILE"] = hosts
        extra += ["--max-np", str(ranks + (mode == "grow")), "--host-discovery-script", script]
    done = subprocess.run(
        [sys.executable, "-m", "hora.runner", "-np", str(ranks), "--min-np",
         str(ranks - 1 if in_place or mode == "leave-relaunch" else ranks),
         *extra, sys.executable, WORKER], env=env, capture_output=True, text=True, timeout=300,
        check=False)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"the recovery job failed:\n{output[-4000:]}")
    went_on = "joined; " if mode == "grow" else "left the job" if mode == "leave" else \
        "go on in place"
    if in_place and went_on not in output:
        raise RuntimeError(f"the ranks did not go on in place:\n{output[-4000:]}")
    if mode == "sharded" and "back to commit 3," not in output:
        raise RuntimeError(f"the ranks did not go back to the last commit:\n{output[-4000:]}")
    events = {m.group(1): float(m.group(2))
              for m in re.finditer(r"bench-elastic (\w+) ([0-9.]+)", output)}
    needed = ({"relaunch": ["killed", "first_step", "initialized", "restored"],
               "grow": ["slots_added"],
               "leave": ["slots_removed", "leave_commit", "left_first_step"],
               "leave-relaunch": ["slots_removed", "first_step", "initialized", "restored"]}
              .get(mode, ["killed", "first_step", "reset"]))
    if mode == "sharded":
        needed.append("commit_mean")
    if mode in ("replace", "grow"):
        needed += ["joiner_started", "joiner_first_step", "grow_commit", "grown_first_step"]
    if any(name not in events for name in needed):
        raise RuntimeError(f"the recovery job did not report its events:\n{output[-4000:]}")
    return events


def _recovery_row(mode: str, ranks: int, events: dict[str, float]) -> dict[str, Any]:
    row: dict[str, Any] = {"mode": mode, "ranks": ranks}
    if mode in ("leave", "leave-relaunch"):
        first = events["left_first_step" if mode == "leave" else "first_step"]
        row["slot_to_first_step_s"] = first - events["slots_removed"]
        summary = (f"{row['slot_to_first_step_s']:.2f} s from the slot's removal to the first "
                   f"step without the last rank")
        if mode == "leave":
            pause = first - events["leave_commit"]
            row["survivors_pause_s"] = pause
            split = (f"the ranks paused {pause * 1e3:.0f} ms from the commit at which it left "
                     f"(a step: 30 ms of sleep and ~1 ms of work)")
        else:
            init = events["initialized"] - events["slots_removed"]
            row.update(slot_to_init_s=init)
            split = f"{init:.2f} s to hora.init() in the new world"
        row["summary"] = f"{summary} ({split})"
        return row
    if mode == "grow":
        added = events["joiner_first_step"] - events["slots_added"]
        row["slot_to_first_step_s"] = added
        summary = f"{added:.2f} s from the slot's appearance to the new process's first step"
    else:
        row["kill_to_first_step_s"] = events["first_step"] - events["killed"]
        summary = f"{row['kill_to_first_step_s']:.3f} s from SIGKILL to the first step after it"
    if mode in ("in-place", "in-place-tcp", "replace", "sharded"):
        settle = events["reset"] - events["killed"]
        redone = events["first_step"] - events["reset"]
        row.update(kill_to_reset_s=settle, redone_step_s=redone)
        if mode == "sharded":
            split = (f"{settle * 1e3:.0f} ms to detect, re-form and restore the last commit "
                     f"from the buddy copies, {redone * 1e3:.0f} ms to copy the parts again "
                     f"and take the first step; steps 30-34 are then redone; a commit took "
                     f"{events['commit_mean'] * 1e3:.1f} ms on average")
            row["commit_mean_s"] = events["commit_mean"]
        else:
            split = (f"{settle * 1e3:.0f} ms to detect and re-form, "
                     f"{redone * 1e3:.0f} ms to sync and redo the step")
    elif mode == "relaunch":
        init = events["initialized"] - events["killed"]
        restore = events["restored"] - events["initialized"]
        row.update(kill_to_init_s=init, restore_s=restore)
        split = f"{init:.2f} s to hora.init(), {restore:.2f} s restoring"
    if mode in ("replace", "grow"):
        joined = events["joiner_first_step"] - events["joiner_started"]
        pause = events["grown_first_step"] - events["grow_commit"]
        row.update(replacement_start_to_step_s=joined, survivors_pause_s=pause)
        new = "replacement" if mode == "replace" else "new process"
        part = (f"the {new}'s first step {joined:.2f} s after its start, the ranks paused "
                f"{pause * 1e3:.0f} ms (a step: 30 ms of sleep and ~1 ms of work)")
        split = f"{split}; {part}" if mode == "replace" else part
    row["summary"] = f"{summary} ({split})"
    return row


def measure_recovery(repeats: int, modes: list[str], sizes: list[int]) -> list[dict]:
    rows = []
    for mode in modes:
        for ranks in {"in-place": sizes, "in-place-tcp": sizes, "sharded": sizes,
                      "leave": sizes, "replace": [3], "leave-relaunch": [3]}.get(mode, [2]):
            for _ in range(repeats):
                with tempfile.TemporaryDirectory(prefix="hora-bench-elastic-") as folder:
                    events = _recovery_job(ranks, mode, folder)
                row = _recovery_row(mode, ranks, events)
                rows.append(row)
                print(f"  {mode}, {ranks} ranks: {row['summary']}", flush=True)
    return rows


def _training_pids() -> list[int]:
    """The churn job's training processes (not horarun's rank wrappers,
    whose command line names the worker too)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if len(args) > 1 and args[1] == WORKER.encode():
            pids.append(int(entry))
    return pids


def _churn_job(mode: str, seconds: float, every: float, folder: str) -> dict[str, float]:
    import random
    import signal
    launched = time.time()
    deadline = launched + seconds
    env = dict(os.environ, HORA_ELASTIC_STATE_DIR=os.path.join(folder, "state"),
               HORA_BENCH_DEADLINE=f"{deadline:.3f}", HORA_BENCH_STEP_SLEEP="0.05",
               HORA_BENCH_CUDA="1" if _CUDA else "0")
    # (relaunched, a world that fails within a minute counts against its
    # host; three in a row would leave this machine out)
    extra = {"relaunch": ["--min-np", "3", "--blacklist-cooldown-range", "1", "1"],
             "in-place": ["--min-np", "2", "--elastic-in-place"],
             "in-place-tcp": ["--min-np", "2", "--elastic-in-place", "--transport", "tcp"]}[mode]
    job = subprocess.Popen([sys.executable, "-m", "hora.runner", "-np", "3", *extra,
                            sys.executable, WORKER], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    kills = 0
    chooser = random.Random(0)
    next_kill = launched + every
    while every > 0 and job.poll() is None and next_kill < deadline - 5:
        time.sleep(max(0.0, next_kill - time.time()))
        pids = _training_pids()
        if pids:
            try:
                os.kill(chooser.choice(pids), signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        next_kill += every
    try:
        output, _ = job.communicate(timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        job.kill()
        output, _ = job.communicate()
        raise RuntimeError(f"the churn job ({mode}) hung:\n{output[-6000:]}") from None
    found = re.findall(r"bench-elastic-samples (\d+) (\d+)", output)
    if job.returncode != 0 or not found:
        raise RuntimeError(f"the churn job ({mode}) failed:\n{output[-4000:]}")
    samples, size = (int(v) for v in found[-1])
    return {"samples": samples, "final_size": size, "kills": kills,
            "replacements": output.count("replacement process(es) joined"),
            "relaunches": len(re.findall(r"horarun: elastic reset \d+", output))}


def measure_churn(seconds: float, every: float) -> list[dict]:
    rows: list[dict[str, Any]] = []
    for name, mode, kill_every in (("no kills", "in-place", 0.0),
                                   ("in place", "in-place", every),
                                   ("in place, tcp", "in-place-tcp", every),
                                   ("relaunch", "relaunch", every)):
        with tempfile.TemporaryDirectory(prefix="hora-bench-churn-") as folder:
            row = {"variant": name, **_churn_job(mode, seconds, kill_every, folder)}
        rows.append(row)
        print(f"  churn, {name}: {row['samples']} samples in {seconds:g} s, {row['kills']} "
              f"kills, {row['replacements']} replacements joined, {row['relaunches']} "
              f"relaunches, world of {row['final_size']} at the end", flush=True)
    for row in rows:
        row["efficiency"] = row["samples"] / rows[0]["samples"]
    print("  churn efficiency (samples against no kills): " + ", ".join(
        f"{row['variant']} {row['efficiency']:.3f}" for row in rows[1:]), flush=True)
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
    global _CUDA
    args = build_parser().parse_args(argv)
    _CUDA = args.cuda
    results: dict[str, Any] = {"benchmark": "elastic", "cuda": args.cuda}
    if not args.skip_recovery:
        print("# elastic recovery: the last rank SIGKILLed at step 30 (grow: a slot added "
              "then; leave: one removed)", flush=True)
        modes = [m for m in args.modes.split(",") if m]
        results["recovery"] = measure_recovery(args.repeats, modes,
                                               [int(r) for r in args.ranks.split(",")])
        for mode in modes:
            for ranks in sorted({r["ranks"] for r in results["recovery"] if r["mode"] == mode}):
                key = ("slot_to_first_step_s" if mode in ("grow", "leave", "leave-relaunch")
                       else "kill_to_first_step_s")
                median = statistics.median(r[key] for r in results["recovery"]
                                           if r["mode"] == mode and r["ranks"] == ranks)
                print(f"  median, {mode}, {ranks} ranks: {median:.3f} s", flush=True)
    if args.churn:
        print(f"# elastic churn: 3 ranks, a SIGKILL every {args.kill_every:g} s for "
              f"{args.churn_seconds:g} s", flush=True)
        results["churn"] = measure_churn(args.churn_seconds, args.kill_every)
    print("# elastic commit cost (one process)", flush=True)
    results["commit"] = measure_commit([float(s) for s in args.sizes_mb.split(",")],
                                       args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
