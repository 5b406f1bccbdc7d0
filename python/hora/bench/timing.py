"""Timing helpers shared by the benchmarks: every rank times the same loop and
the slowest rank's time is the result, as nccl-tests reports it."""

import statistics
import time

from mpi4py import MPI


def timed(fn, iterations, comm):
    """Seconds per call of ``fn`` (max over ranks), after one warm-up call."""
    fn()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    elapsed = (time.perf_counter() - start) / iterations
    return comm.allreduce(elapsed, op=MPI.MAX)


def timed_interleaved(fns, iterations, comm):
    """Median seconds per call of each of ``fns``, run in turn in every
    iteration (each call starts from a barrier; the slowest rank's time
    counts), so that drift in the machine's speed hits all of them alike."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(iterations):
        for k, fn in enumerate(fns):
            comm.Barrier()
            start = time.perf_counter()
            fn()
            samples[k].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return [statistics.median(s) for s in samples]


def iterations_for(nbytes, budget_seconds=0.25, bandwidth_bytes_per_second=2e9, cap=1000):
    """A loop count that keeps each size near ``budget_seconds``."""
    estimate = 20e-6 + nbytes / bandwidth_bytes_per_second
    return max(3, min(cap, int(budget_seconds / estimate)))


def percentile(values, q):
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, int(round(q / 100 * (len(ordered) - 1)))))
    return ordered[index]
