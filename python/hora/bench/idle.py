"""python -m hora.bench idle: CPU a rank's process spends while it waits.

Plain ``idle`` watches every rank do nothing after one allreduce: hora's
engine thread against the alternatives that keep a background thread
(Horovod). ``idle --busy-set RANKS`` keeps a process set of those ranks busy
with small blocking allreduces all the while, and watches what every rank
spends: a caller waiting on the busy set must keep only that set's engine
cycling, not the job's engine (which the other ranks share) nor any other
set's. One allreduce over the whole job as the watch begins wakes the
job's engine, which must then sleep again. Each rank's time is also split
by thread (Linux): the main thread, the threads the process had before the
set was added (the job's engine among them) and those that came with the
set.
"""

import os
import threading
import time

import numpy as np

import hora
from hora.bench import implementations


def cpu_share(seconds, work=None):
    """The whole process's CPU time over ``seconds`` of wall time, in % of
    a core, while ``work`` (a callable returning False to stop) runs or
    the process sleeps (``seconds`` then bounds the work)."""
    wall, cpu = time.perf_counter(), time.process_time()
    end = wall + seconds
    if work is None:
        time.sleep(seconds)
    else:
        while time.perf_counter() < end and work():
            pass
    return (time.process_time() - cpu) / (time.perf_counter() - wall) * 100


def thread_ticks():
    """CPU time of each thread of this process, {thread id: clock ticks},
    from /proc (Linux); empty where /proc has no task list."""
    ticks = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return ticks
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        ticks[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
    return ticks


def split_by_thread(before_set, start, end, wall):
    """% of a core over ``wall`` seconds for the main thread, the other
    threads that ran before the set was added (the job's engine, MPI's own)
    and the threads that came with the set (its engine)."""
    hz = os.sysconf("SC_CLK_TCK")
    main = threading.get_native_id()
    parts = {"main": 0, "job threads": 0, "set threads": 0}
    for tid, ticks in end.items():
        spent = ticks - start.get(tid, 0)
        part = "main" if tid == main else "job threads" if tid in before_set else "set threads"
        parts[part] += spent
    return {k: v / hz / wall * 100 for k, v in parts.items()}


def run(args, comm, log):
    if args.busy_set:
        return run_beside_busy_set(args, comm, log)
    # hora and the alternatives with a background thread of their own (the
    # others cost nothing between calls), one at a time: what is measured is
    # the whole process's CPU time
    known = implementations.KNOWN
    names = [n for n in args.compare if n not in known or getattr(known[n], "background", False)]
    rows = []
    for impl in implementations.load(["hora"] + names, log):
        with implementations.started([impl]):
            impl.allreduce(np.zeros(1, np.float32))
            comm.Barrier()
            share = cpu_share(args.seconds)
            shares = comm.gather(share, root=0)
            for rank, value in enumerate(shares or []):
                rows.append({"impl": impl.name, "rank": rank, "idle_cpu_percent": value})
                log(f"  {impl.name:>8}  rank {rank}: {value:.2f}% of a core while idle "
                    f"({args.seconds:.0f} s, whole process)")
    return rows


def run_beside_busy_set(args, comm, log):
    ranks = args.busy_set
    before_set = set(thread_ticks())
    busy = hora.add_process_set(ranks)
    member = comm.Get_rank() in ranks
    rounds = [0]
    end = [0.0]

    def step():
        # Every member stops after the same allreduce: the first whose time
        # is up says so inside it.
        x = np.array([0.0, 1.0 if time.perf_counter() >= end[0] else 0.0], np.float32)
        hora.allreduce_(x, name="bench.idle.busy", op=hora.Sum, process_set=busy)
        rounds[0] += 1
        return x[1] == 0

    comm.Barrier()
    end[0] = time.perf_counter() + args.seconds
    start_ticks, wall = thread_ticks(), time.perf_counter()
    # One allreduce over the whole job as the window opens wakes the job's
    # engine on every rank; it must go back to sleep although the busy
    # set's callers keep waiting (they wait on another engine).
    wake = hora.allreduce_async(np.zeros(1, np.float32), name="bench.idle.wake")
    if not member:
        hora.synchronize(wake)
    share = cpu_share(args.seconds + 60, step) if member else cpu_share(args.seconds)
    if member:
        hora.synchronize(wake)
    split = split_by_thread(before_set, start_ticks, thread_ticks(), time.perf_counter() - wall)
    shares = comm.gather(share, root=0)
    splits = comm.gather(split, root=0)
    total = comm.gather(rounds[0], root=0)
    hora.remove_process_set(busy)
    rows = []
    log(f"# process set {ranks} runs 8-byte allreduces for {args.seconds:.0f} s; "
        f"every rank's whole process:")
    for rank, value in enumerate(shares or []):
        role = "busy set" if rank in ranks else "idle"
        parts = splits[rank]
        rows.append({"impl": "hora", "rank": rank, "role": role, "cpu_percent": value,
                     **{f"{k.replace(' ', '_')}_cpu_percent": v for k, v in parts.items()}})
        log(f"  rank {rank} ({role:>8}): {value:6.2f}% of a core" +
            (f", {total[rank]} allreduces" if rank in ranks else "") +
            "; by thread: " + ", ".join(f"{k} {v:.2f}%" for k, v in parts.items()))
    return rows
