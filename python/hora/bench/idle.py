"""python -m hora.bench idle: CPU a rank's process spends while it waits.

Plain ``idle`` watches every rank do nothing after one allreduce: hora's
engine thread against the alternatives that keep a background thread
(Horovod). ``idle --busy-set RANKS`` keeps a process set of those ranks busy
with small blocking allreduces all the while, and watches what every rank
spends: a caller waiting on the busy set must keep only that set's engine
cycling, not the job's engine (which the other ranks share) nor any other
set's.
"""

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
    share = cpu_share(args.seconds + 60, step) if member else cpu_share(args.seconds)
    shares = comm.gather(share, root=0)
    total = comm.gather(rounds[0], root=0)
    hora.remove_process_set(busy)
    rows = []
    log(f"# process set {ranks} runs 8-byte allreduces for {args.seconds:.0f} s; "
        f"every rank's whole process:")
    for rank, value in enumerate(shares or []):
        role = "busy set" if rank in ranks else "idle"
        rows.append({"impl": "hora", "rank": rank, "role": role, "cpu_percent": value})
        log(f"  rank {rank} ({role:>8}): {value:6.2f}% of a core" +
            (f", {total[rank]} allreduces" if rank in ranks else ""))
    return rows
