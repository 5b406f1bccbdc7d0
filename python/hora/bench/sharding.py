"""python -m hora.bench sharding: memory and speed of sharded training.

A transformer trains with Adam on one fixed batch per rank, in each of the
ways of :mod:`hora.bench.sharding_variants`: hora replicated, hora with
``sharding="optimizer_state"`` (ZeRO-1), ``"gradients"`` (ZeRO-2) and
``"parameters"`` (ZeRO-3), and, with --compare, PyTorch's DDP +
ZeroRedundancyOptimizer and FSDP2 over gloo. With --cuda each rank trains
on GPU local_rank modulo the GPUs there (hora's variants only), and memory
is the peak of torch's CUDA allocator above what it held before the variant
was built.
Three measurements (--measure):

memory      each variant alone in turn: the bytes of Adam's state and of
            the gradients kept between backward and step on each rank, and
            the process's peak resident memory during --steps steps above
            what it held before the variant was built (the high-water mark
            is reset through /proc/self/clear_refs; glibc is told to return
            freed blocks to the system at once, so the mark counts live
            memory).
throughput  samples/sec of every variant in alternating blocks, as
            torch-synthetic times them (median and range over iterations,
            ratios taken per iteration), and the largest difference of any
            weight between ranks afterwards.
largest     for hora replicated, ZeRO-2 and ZeRO-3 (and FSDP2 with
            --compare fsdp2), the deepest model of --width whose peak memory above
            the baseline stays within --limit-mib on every rank: blocks are
            doubled until one does not fit, then bisected.

Run it under the launcher:
    horarun -np 4 python -m hora.bench sharding --measure memory --width 768 \\
        --layers 10 --vocabulary 16384 --compare ddp_zero,fsdp2 --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import os

import numpy as np
import torch
from mpi4py import MPI

import hora
import hora.torch as hvd
from hora.bench import synthetic
from hora.bench import sharding_variants as variants

MEASUREMENTS = ("memory", "throughput", "largest")


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hora.bench sharding",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--measure", default="memory,throughput",
                        help=f"comma-separated: {', '.join(MEASUREMENTS)}")
    parser.add_argument("--width", type=int, default=256, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="transformer blocks")
    parser.add_argument("--vocabulary", type=int, default=8192, help="tokens")
    parser.add_argument("--sequence", type=int, default=64, help="tokens per sample")
    parser.add_argument("--batch-size", type=int, default=2, help="samples per rank and batch")
    parser.add_argument("--compare", default="",
                        help="comma-separated: ddp_zero (DDP + ZeroRedundancyOptimizer), fsdp2 "
                             "(fully_shard)")
    parser.add_argument("--steps", type=int, default=3,
                        help="memory and largest: training steps per variant")
    parser.add_argument("--limit-mib", type=float, default=512,
                        help="largest: peak memory per rank above the baseline, in MiB")
    parser.add_argument("--max-layers", type=int, default=256, help="largest: most blocks tried")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: the host's cores divided by the "
                             "ranks on it, at least 1)")
    parser.add_argument("--bucket-mib", type=float, default=None,
                        help="hora's sharded variants: bucket_bytes in MiB (default: the "
                             "optimizer's)")
    parser.add_argument("--cuda", action="store_true",
                        help="train on the GPU (hora's variants; memory from torch's CUDA "
                             "allocator)")
    synthetic.add_timing_options(parser)
    synthetic.add_output_options(parser, "samples/sec")
    return parser


def parse(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    synthetic.check_counts(parser, args)
    args.measure = synthetic.parse_compare(parser, args.measure, MEASUREMENTS, "--measure")
    args.compare = synthetic.parse_compare(parser, args.compare, variants.KNOWN)
    if args.cuda and args.compare:
        parser.error("--compare runs over gloo on the CPU; leave it out with --cuda")
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda: torch sees no GPU here")
    for option in ("width", "layers", "vocabulary", "sequence", "steps", "max_layers"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    return args


# --- process memory ------------------------------------------------------------

def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def return_freed_memory_at_once():
    """glibc keeps freed blocks for reuse and raises its mmap threshold after
    large frees; with both fixed low, a tensor freed is memory given back,
    and the resident size counts what is alive."""
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, 64 * 1024)
        _LIBC.mallopt(_M_TRIM_THRESHOLD, 128 * 1024)


def settle():
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def reset_peak():
    """Starts a new high-water mark of resident memory (Linux 4.0+)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


@contextlib.contextmanager
def peak_above_baseline(comm, device=None):
    """Yields a dict that gets ``baseline`` (resident bytes before) and
    ``peak`` (the high-water mark above it) of the block; on a GPU
    ``device``, torch's CUDA allocator's."""
    settle()
    comm.Barrier()
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        found = {"baseline": torch.cuda.memory_allocated(device)}
        yield found
        torch.cuda.synchronize(device)
        found["peak"] = torch.cuda.max_memory_allocated(device) - found["baseline"]
        return
    reset_peak()
    found = {"baseline": _status("VmRSS")}
    yield found
    found["peak"] = _status("VmHWM") - found["baseline"]


# --- measurements ------------------------------------------------------------------

def measured_step(variant):
    """One training step that reads the gradients this rank holds between
    backward and the optimizer's update."""
    optimizer = variant.optimizer
    optimizer.zero_grad()
    from hora.bench import train_models
    train_models.loss(variant.forward(variant.setup.data), variant.setup.target).backward()
    if hasattr(optimizer, "skip_synchronize"):
        optimizer.synchronize()
        gradients = variant.gradient_bytes()
        with optimizer.skip_synchronize():
            optimizer.step()
    else:
        gradients = variant.gradient_bytes()
        optimizer.step()
    return gradients


def memory_of(cls, setup, steps, comm):
    with peak_above_baseline(comm, setup.device) as found:
        variant = cls(setup)
        try:
            for _ in range(steps - 1):
                variant.step()
            gradients = measured_step(variant)
            state = variant.state_bytes()
        finally:
            variant.stop()
            del variant
    return {"state_bytes": state, "gradient_bytes": gradients, "peak_bytes": found["peak"],
            "baseline_bytes": found["baseline"]}


def chosen(args):
    names = list(variants.HORA) + args.compare
    merged = {**variants.HORA, **variants.KNOWN}
    return [(name, merged[name]) for name in names]


def run_memory(args, setup, comm, log):
    log(f"Memory: {setup.parameters() / 1e6:.1f} M parameters, {args.steps} steps per variant, "
        f"each variant alone")
    results = {}
    for name, cls in chosen(args):
        mine = memory_of(cls, setup, args.steps, comm)
        everyone = comm.allgather(mine)
        results[name] = {key: [r[key] for r in everyone] for key in mine}
        log(f"  {name:<12} state {_mib(mine['state_bytes']):9.1f} MiB  gradients "
            f"{_mib(mine['gradient_bytes']):9.1f} MiB  peak above baseline "
            f"{_mib(mine['peak_bytes']):9.1f} MiB  (rank 0)")
    replicated = results["hora"]
    size = comm.Get_size()
    log(f"Per rank, against replicated hora at {size} ranks (the ideal is 1/{size} = "
        f"{1 / size:.3f} for what is sharded):")
    for name, values in results.items():
        ratios = {}
        for key in ("state_bytes", "gradient_bytes", "peak_bytes"):
            worst = max(v / r for v, r in zip(values[key], replicated[key]) if r)
            ratios[key] = worst
        values["ratio_to_replicated"] = ratios
        log(f"  {name:<12} state {ratios['state_bytes']:.3f}  gradients "
            f"{ratios['gradient_bytes']:.3f}  peak {ratios['peak_bytes']:.3f}  (largest rank)")
    return results


def _mib(value):
    return value / 2**20


def run_throughput(args, setup, comm, log):
    made = [(name, cls(setup)) for name, cls in chosen(args)]
    made.insert(1, ("compute_only", variants.ComputeOnly(setup)))
    phase = [variant for _, variant in made]
    log("Throughput: " + "; ".join(f"{v.name} = {v.label}" for v in phase))
    everyone, alone, spreads = synthetic.measure_all(
        phase, lambda: variants.ComputeOnly(setup), args, comm, log)
    agreement = weight_agreement(made, comm)
    return everyone, alone, spreads, agreement


def weight_agreement(made, comm):
    """How far each other synchronized variant's weights are from hora
    replicated's after the same batches (same data, seeds and steps), on
    any rank: the largest difference of any weight, and the norm of the
    differences relative to the norm of the weights."""
    weights = {name: variant.flat_weights() for name, variant in made if variant.synchronized}
    reference = weights["hora"]
    scale = float(np.linalg.norm(reference)) or 1.0
    return {name: {"largest": comm.allreduce(float(np.abs(w - reference).max()) if w.size
                                             else 0.0, op=MPI.MAX),
                   "relative_norm": comm.allreduce(float(np.linalg.norm(w - reference)) / scale,
                                                   op=MPI.MAX)}
            for name, w in weights.items() if name != "hora"}


def run_largest(args, comm, log):
    names = ["hora", "hora_zero2", "hora_zero3"] + [n for n in args.compare if n == "fsdp2"]
    merged = {**variants.HORA, **variants.KNOWN}
    limit = args.limit_mib * 2**20
    found = {}
    for name in names:
        cache = {}

        def fits(layers, name=name, cache=cache):
            if layers not in cache:
                setup = make_setup(args, layers)
                peak = memory_of(merged[name], setup, 2, comm)["peak_bytes"]
                peak = comm.allreduce(peak, op=MPI.MAX)
                cache[layers] = (peak <= limit, peak, setup.parameters())
                log(f"  {name:<12} {layers:4d} blocks, {cache[layers][2] / 1e6:8.1f} M "
                    f"parameters: peak {_mib(peak):8.1f} MiB "
                    f"({'fits' if cache[layers][0] else 'over'})")
            return cache[layers][0]

        low, high = 0, 1
        while high <= args.max_layers and fits(high):
            low, high = high, high * 2
        high = min(high, args.max_layers + 1)
        while high - low > 1:
            middle = (low + high) // 2
            if fits(middle):
                low = middle
            else:
                high = middle
        found[name] = {"layers": low, "parameters": cache[low][2] if low else 0,
                       "peak_bytes": cache[low][1] if low else None}
    base = found["hora"]["parameters"]
    log(f"Largest model within {args.limit_mib:.0f} MiB above the baseline per rank "
        f"(width {args.width}, vocabulary {args.vocabulary}, batch {args.batch_size}):")
    for name, entry in found.items():
        ratio = entry["parameters"] / base if base else float("nan")
        entry["ratio_to_replicated"] = ratio
        log(f"  {name:<12} {entry['layers']:4d} blocks, {entry['parameters'] / 1e6:8.1f} M "
            f"parameters ({ratio:.2f}x replicated)")
    return found


def device(args):
    if not args.cuda:
        return torch.device("cpu")
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


def make_setup(args, layers):
    """What every variant trains: a transformer of ``layers`` blocks."""
    bucket_bytes = None if args.bucket_mib is None else int(args.bucket_mib * 2**20)
    return variants.Setup(args.width, layers, args.vocabulary, args.sequence, args.batch_size,
                          hvd.rank(), device=device(args), bucket_bytes=bucket_bytes)


def run(args):
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = hvd.rank(), hvd.size()
    cores = os.cpu_count() or 1
    torch.set_num_threads(args.threads or max(1, cores // hvd.local_size()))
    if args.cuda:
        torch.cuda.set_device(device(args))

    def log(message):
        if rank == 0:
            print(message, flush=True)

    results = {"benchmark": "sharding", "ranks": size, "width": args.width,
               "layers": args.layers, "vocabulary": args.vocabulary, "sequence": args.sequence,
               "batch_size": args.batch_size, "threads_per_rank": torch.get_num_threads(),
               "hora_version": hora.__version__, "torch_version": torch.__version__,
               "num_warmup_batches": args.num_warmup_batches,
               "num_batches_per_iter": args.num_batches_per_iter, "num_iters": args.num_iters}
    try:
        setup = None
        if "memory" in args.measure or "throughput" in args.measure:
            setup = make_setup(args, args.layers)
            results["parameters"] = setup.parameters()
            log(f"Model: transformer, width {args.width}, {args.layers} blocks, vocabulary "
                f"{args.vocabulary}, {setup.parameters() / 1e6:.1f} M parameters; batch "
                f"{args.batch_size} x {args.sequence} tokens per rank; {size} ranks, "
                f"{torch.get_num_threads()} thread(s) each")
        # throughput first: the memory measurements change how glibc allocates
        if "throughput" in args.measure:
            everyone, alone, spreads, agreement = run_throughput(args, setup, comm, log)
            if rank == 0:
                synthetic.report(results, everyone, alone, spreads, PAIRS, unit="samples/sec")
                results["weight_difference_to_hora"] = agreement
                for name, value in agreement.items():
                    print(f"Weights against hora replicated after training, {name}: largest "
                          f"difference {value['largest']:.3g}, relative to the norm "
                          f"{value['relative_norm']:.3g}")
        if "memory" in args.measure or "largest" in args.measure:
            return_freed_memory_at_once()
        if "memory" in args.measure:
            results["memory"] = run_memory(args, setup, comm, log)
        if "largest" in args.measure:
            results["largest"] = run_largest(args, comm, log)
    finally:
        variants.stop_torch_distributed()
    if rank == 0 and (args.json or args.plot):
        if "variants" not in results:
            args.plot = None  # the plot shows throughput
        synthetic.write(results, args, f"transformer {results.get('parameters', 0) / 1e6:.1f} M "
                                       f"parameters, Adam, {size} ranks", "hora",
                        unit="samples/sec")
    hvd.shutdown()
    return 0


PAIRS = [("hora_zero1", "hora"), ("hora_zero2", "hora"), ("hora_zero3", "hora"),
         ("hora", "compute_only"), ("hora_zero2", "ddp_zero"), ("hora_zero2", "fsdp2"),
         ("hora_zero3", "fsdp2"), ("hora_zero1", "ddp_zero")]


def main(argv=None):
    return run(parse(argv))
