"""``python -m hora.bench autotune``: on the ResNet-50 gradient set, the
throughput of hand-picked fusion thresholds side by side with what
HORA_AUTOTUNE=1 settles on by itself.

Each setting restarts hora with its environment, warms up, then times full
steps (161 tensors submitted asynchronously, then waited for) for
``--seconds``. Throughput is gradient bytes reduced per second per rank.
"""
import os
import time

import numpy as np
from mpi4py import MPI

import hora
from hora._loader import _C
from hora.bench import implementations, resnet50

MiB = 1 << 20
HAND_PICKED_MIB = (1, 4, 16, 64, 128)
_TUNING = ("HORA_FUSION_THRESHOLD_BYTES", "HORA_CYCLE_TIME_MS", "HORA_AUTOTUNE",
           "HORA_AUTOTUNE_SAMPLE_SECONDS", "HORA_AUTOTUNE_LOG")


def _restart(settings):
    hora.shutdown()
    for name in _TUNING:
        os.environ.pop(name, None)
    os.environ.update({k: str(v) for k, v in settings.items()})
    hora.init()


def _throughput(step, step_bytes, seconds, comm):
    for _ in range(3):
        step()
    comm.Barrier()
    began = time.perf_counter()
    steps = 0
    while True:
        step()
        steps += 1
        # Every rank runs the same number of steps: rank 0 decides.
        if steps % 5 == 0 and comm.bcast(time.perf_counter() - began >= seconds, root=0):
            break
    elapsed = comm.allreduce(time.perf_counter() - began, op=MPI.MAX)
    return steps * step_bytes / elapsed


def run(args, comm, log):
    shapes = resnet50.gradient_shapes()
    # non-zero data, as real gradients are (see run_fusion in __main__)
    buffers = [np.full(int(np.prod(s)), 1e-30, np.float32) for s in shapes]
    step_bytes = sum(b.nbytes for b in buffers)
    impl = implementations.Hora()
    step = lambda: impl.allreduce_async_many(buffers)  # noqa: E731
    log(f"# ResNet-50 gradients: {len(shapes)} tensors, {step_bytes / MiB:.1f} MiB, "
        f"{comm.Get_size()} ranks; {args.seconds:g} s per setting")
    rows = []
    for mib in HAND_PICKED_MIB:
        _restart({"HORA_FUSION_THRESHOLD_BYTES": mib * MiB, "HORA_CYCLE_TIME_MS": 0})
        rate = _throughput(step, step_bytes, args.seconds, comm)
        rows.append({"setting": f"threshold {mib} MiB, cycle 0 ms", "bytes_per_second": rate})
        log(f"  hand-picked  threshold {mib:>4} MiB  cycle 0 ms   {rate / 1e9:7.3f} GB/s")

    _restart({"HORA_AUTOTUNE": 1, "HORA_AUTOTUNE_SAMPLE_SECONDS": args.sample_seconds,
              **({"HORA_AUTOTUNE_LOG": args.autotune_log} if args.autotune_log else {})})
    began = time.perf_counter()
    steps = 0
    while True:
        step()
        steps += 1
        if steps % 5 == 0:
            searching = _C.engine_parameters()["autotuning"] if comm.Get_rank() == 0 else None
            if not comm.bcast(searching, root=0):
                break
    settle = time.perf_counter() - began
    state = _C.engine_parameters()
    rate = _throughput(step, step_bytes, args.seconds, comm)
    best = max(rows, key=lambda r: r["bytes_per_second"])
    threshold = state["fusion_threshold_bytes"]
    rows.append({"setting": "autotuned", "bytes_per_second": rate,
                 "fusion_threshold_bytes": threshold, "cycle_time_ms": state["cycle_time_ms"],
                 "settle_seconds": settle, "settle_steps": steps,
                 "fraction_of_best": rate / best["bytes_per_second"]})
    log(f"  autotuned    threshold {threshold / MiB:>4g} MiB  cycle {state['cycle_time_ms']:g} ms"
        f"   {rate / 1e9:7.3f} GB/s   ({rate / best['bytes_per_second'] * 100:.0f}% of the best "
        f"hand-picked, {best['setting']}; settled after {settle:.1f} s, {steps} steps, "
        f"{len(state['history'])} settings tried)")
    for name in _TUNING:
        os.environ.pop(name, None)
    return rows
