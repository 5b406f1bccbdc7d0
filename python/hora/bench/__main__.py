"""python -m hora.bench BENCHMARK: hora side by side with the alternatives in one job.

BENCHMARK is one of allreduce, allgather, broadcast, reducescatter, alltoall,
latency, fusion, autotune, idle, torch-synthetic, sharding, tf-synthetic,
host-cost, gpu-kernels, gpu-allreduce, elastic, negotiation, multihost and
compression.

Run under the launcher, e.g.:
    horarun -np 2 python -m hora.bench allreduce --compare mpi,gloo --json out.json --plot out.png
    horarun -np 2 python -m hora.bench torch-synthetic --model resnet20 --json out.json

torch-synthetic (training images/sec with hora.torch.DistributedOptimizer, in
the manner of Horovod's pytorch_synthetic_benchmark.py) takes its own options:
    python -m hora.bench torch-synthetic --help

sharding (memory per rank, speed and the largest trainable model of the
sharded DistributedOptimizer against replicated hora, DDP +
ZeroRedundancyOptimizer and FSDP2) too:
    python -m hora.bench sharding --help

tf-synthetic (Keras training samples/sec with hora against TensorFlow's
MultiWorkerMirroredStrategy, in the manner of Horovod's
tensorflow2_keras_synthetic_benchmark.py) too:
    python -m hora.bench tf-synthetic --help

host-cost (the host's cost per tensor of grouped and per-tensor allreduces of
torch tensors above one flat allreduce, against torch.distributed) too:
    python -m hora.bench host-cost --help

gpu-kernels (the CUDA kernels' throughput against a device-to-device copy, on
one GPU, no launcher needed) too:
    python -m hora.bench gpu-kernels --help
gpu-allreduce (CUDA tensors through hora against torch.distributed with NCCL;
one process for one rank, or under the launcher with a GPU per rank) too:
    python -m hora.bench gpu-allreduce --help
and elastic (recovery time after a lost rank, and the cost of commit(); it
starts its own jobs, no launcher needed):
    python -m hora.bench elastic --help
and negotiation (the negotiation of 8 to 1024 ranks simulated as threads of
one process, and a cost model of a step at scale; no launcher needed):
    python -m hora.bench negotiation --help
and multihost (allreduce across pretend hosts, network namespaces whose links
are limited to a fixed rate; needs root, starts its own job):
    python -m hora.bench multihost --help
and compression (training across pretend hosts with links of a fixed rate,
float32 hora against fp16, PowerSGD and DDP's PowerSGD hook, bytes on the
wire counted; needs root, starts its own jobs):
    python -m hora.bench compression --help
"""

import argparse
import json
import sys
import time

import numpy as np

try:
    from mpi4py import MPI
except ImportError as exc:
    raise SystemExit("python -m hora.bench needs mpi4py for its MPI baselines: "
                     "pip install 'hora[bench]' (or pip install mpi4py)") from exc

import hora
from hora.bench import implementations, resnet50
from hora.bench import world as bench_world
from hora.bench.timing import iterations_for, percentile, timed, timed_interleaved

# (busbw factor, check) per collective; factors follow nccl-tests with the
# size column meaning bytes per rank's input.
BUS_FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: n - 1,
    "broadcast": lambda n: 1.0,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


# The world rank that prints: the first rank of the measured ranks.
LOG_RANK = 0


def log(message):
    if hora.rank() == LOG_RANK:
        print(message, flush=True)


def busy_signal(busy, done):
    """Whether the measuring ranks are done, agreed by the busy set's ranks
    (each of them must stop after the same allreduce)."""
    flag = np.array([1.0 if done.Test() else 0.0])
    return hora.allreduce(flag, name="bench.busy.done", op=hora.Max, process_set=busy)[0] > 0


def parse_ranks(text, option, size):
    try:
        ranks = sorted({int(r) for r in text.split(",") if r.strip()})
    except ValueError:
        raise SystemExit(f"{option} {text!r}: expected comma-separated ranks, e.g. 0,1") from None
    if not ranks or ranks[0] < 0 or ranks[-1] >= size:
        raise SystemExit(f"{option} {text!r}: ranks must lie in 0..{size - 1}")
    return ranks


def sizes(minimum, maximum):
    size = minimum
    while size <= maximum:
        yield size
        size *= 4 if size < 1 << 20 else 2


def count_wrong(kind, impl, nbytes, comm):
    """Runs the collective once on known data and counts wrong elements."""
    n, rank = comm.Get_size(), comm.Get_rank()
    if kind in ("reducescatter", "alltoall"):
        count = max(n, nbytes // 4 // n * n)
    else:
        count = max(1, nbytes // 4)
    x = np.full(count, rank + 1, np.float32)
    if kind == "allreduce":
        impl.allreduce(x)
        wrong = np.count_nonzero(x != n * (n + 1) / 2)
    elif kind == "broadcast":
        impl.broadcast(x)
        wrong = np.count_nonzero(x != 1)
    elif kind == "allgather":
        result = impl.allgather(x)
        parts = result if isinstance(result, list) else [result]
        out = np.concatenate([np.asarray(p).reshape(-1) for p in parts])
        expected = np.repeat(np.arange(1, n + 1, dtype=np.float32), count)
        wrong = np.count_nonzero(out != expected)
    elif kind == "reducescatter":
        out = np.asarray(impl.reducescatter(x))
        wrong = np.count_nonzero(out != n * (n + 1) / 2)
    else:
        out = np.asarray(impl.alltoall(x))
        expected = np.repeat(np.arange(1, n + 1, dtype=np.float32), count // n)
        wrong = np.count_nonzero(out != expected)
    return comm.allreduce(int(wrong), op=MPI.SUM)


def run_sweep(args, comm):
    impls = implementations.load(["hora"] + args.compare, log)
    n = comm.Get_size()
    rows = []
    log(f"# {args.collective}, float32, {n} ranks; size = bytes per rank; busbw = algbw x "
        f"{BUS_FACTORS[args.collective](n):.3g}")
    log(f"# {'size':>11} {'count':>10} {'type':>7} {'impl':>8} {'time(us)':>11} "
        f"{'algbw(GB/s)':>11} {'busbw(GB/s)':>11} {'#wrong':>6}")
    for group in implementations.phases(impls):
        with implementations.started(group):
            rows += sweep_group(args, comm, group)
    return rows


def sweep_group(args, comm, impls):
    n = comm.Get_size()
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        count = max(1, nbytes // 4)
        if args.collective in ("reducescatter", "alltoall"):
            count = max(n, count // n * n)
        for impl in impls:
            try:
                wrong = count_wrong(args.collective, impl, nbytes, comm)
            except NotImplementedError:
                continue
            # non-zero data, as real gradients are (see run_fusion)
            buffer = np.full(count, 1e-30, np.float32)
            call = getattr(impl, args.collective)
            fn = lambda call=call, buffer=buffer: call(buffer)  # noqa: E731
            if args.timing == "barrier":
                seconds = timed_interleaved([fn], iterations_for(nbytes), comm)[0]
            else:
                seconds = timed(fn, iterations_for(nbytes), comm)
            algbw = count * 4 / seconds / 1e9
            busbw = algbw * BUS_FACTORS[args.collective](n)
            rows.append({"collective": args.collective, "size": count * 4, "count": count,
                         "impl": impl.name, "ranks": n, "time_us": seconds * 1e6,
                         "algbw": algbw, "busbw": busbw, "wrong": wrong})
            log(f"  {count * 4:>11} {count:>10} {'float':>7} {impl.name:>8} {seconds * 1e6:>11.1f} "
                f"{algbw:>11.3f} {busbw:>11.3f} {wrong:>6}")
    return rows


def run_latency(args, comm):
    impls = implementations.load(["hora"] + args.compare, log)
    rows = []
    log(f"# 8-byte allreduce round trip, {comm.Get_size()} ranks, {args.iterations} iterations")
    for group in implementations.phases(impls):
        with implementations.started(group):
            rows += [latency_row(args, comm, impl) for impl in group]
    if args.idle_set:
        rows += idle_set_latency(args, comm, impls[0])
    return rows


def round_trips(comm, impl, iterations):
    x = np.zeros(2, np.float32)
    for _ in range(50):
        impl.allreduce(x)
    samples = []
    comm.Barrier()
    for _ in range(iterations):
        start = time.perf_counter()
        impl.allreduce(x)
        samples.append(time.perf_counter() - start)
    return samples


def latency_row(args, comm, impl, label=None, samples=None):
    if samples is None:
        samples = round_trips(comm, impl, args.iterations)
    p50 = comm.allreduce(percentile(samples, 50), op=MPI.MAX) * 1e6
    p99 = comm.allreduce(percentile(samples, 99), op=MPI.MAX) * 1e6
    label = label or impl.name
    log(f"  {label:>8}  p50 {p50:8.1f} us   p99 {p99:8.1f} us")
    return {"impl": label, "p50_us": p50, "p99_us": p99}


def idle_set_latency(args, comm, impl):
    """hora's round trip on the global set without and with a second,
    idle process set, in alternating blocks (the set is added and removed
    between them), so that drift hits both alike."""
    log(f"# the same with and without an idle process set of ranks {args.idle_set}, "
        f"alternating blocks")
    blocks = 6
    without, with_set = [], []
    for _ in range(blocks):
        without += round_trips(comm, impl, args.iterations // blocks)
        idle = hora.add_process_set(args.idle_set)
        with_set += round_trips(comm, impl, args.iterations // blocks)
        hora.remove_process_set(idle)
    return [latency_row(args, comm, impl, "no set", without),
            latency_row(args, comm, impl, "idle set", with_set)]


def run_fusion(args, comm):
    impls = implementations.load(["hora"] + args.compare, log)
    shapes = resnet50.gradient_shapes()
    # Gradients are not zero: all-zero buffers let the kernel keep (or put
    # back) its shared zero page under them, and every write then faults in
    # and clears fresh pages, which measures the kernel rather than the
    # allreduce. The values start tiny so that summing in place over many
    # repetitions stays finite.
    buffers = [np.full(int(np.prod(s)), 1e-30, np.float32) for s in shapes]
    total = sum(b.size for b in buffers)
    concatenated = np.full(total, 1e-30, np.float32)
    log(f"# ResNet-50 gradients: {len(shapes)} tensors, {total * 4 / 2**20:.1f} MiB, "
        f"{comm.Get_size()} ranks")
    rows = []
    for group in implementations.phases(impls):
        with implementations.started(group):
            for impl in group:
                # Alternating the two runs keeps a drifting machine from
                # favouring either; medians keep a stray slow step from deciding.
                many, one = timed_interleaved(
                    [lambda impl=impl: impl.allreduce_async_many(buffers),
                     lambda impl=impl: impl.allreduce(concatenated)], args.iterations, comm)
                rows.append({"impl": impl.name, "tensors_ms": many * 1e3,
                             "concatenated_ms": one * 1e3, "ratio": many / one})
                log(f"  {impl.name:>8}  {len(shapes)} tensors: {many * 1e3:8.2f} ms   one "
                    f"concatenated buffer: {one * 1e3:8.2f} ms   ratio {many / one:5.2f}")
    return rows


def plot(rows, path):
    from hora.bench.plotting import busbw_plot
    series = {}
    for r in rows:
        series.setdefault(r["impl"], []).append((r["size"], r["busbw"]))
    busbw_plot(series, f"{rows[0]['collective']}, {rows[0]['ranks']} ranks, float32", path)


def build_parser():
    """The command line of ``python -m hora.bench``."""
    parser = argparse.ArgumentParser(prog="python -m hora.bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", choices=sorted(BUS_FACTORS) + ["latency", "fusion", "autotune",
                                                                    "idle", "torch-synthetic",
                                                                    "sharding", "tf-synthetic",
                                                                    "host-cost", "gpu-kernels",
                                                                    "elastic",
                                                                    "negotiation", "multihost",
                                                                    "compression"],
                        help="torch-synthetic, sharding, tf-synthetic, gpu-kernels, elastic, "
                             "negotiation, multihost and compression have options of their own: "
                             "torch-synthetic --help, gpu-kernels --help")
    parser.add_argument("--compare", default="mpi",
                        help="comma-separated alternatives to run alongside hora: mpi, gloo, "
                             "horovod (default: mpi; '' for none). Horovod runs in a phase of its "
                             "own; idle measures hora and horovod only")
    parser.add_argument("--min-bytes", type=int, default=8,
                        help="smallest message of a size sweep, in bytes (default 8)")
    parser.add_argument("--max-bytes", type=int, default=256 << 20,
                        help="largest message of a size sweep, in bytes (default 256 MiB)")
    parser.add_argument("--timing", choices=("loop", "barrier"), default="loop",
                        help="size sweeps: 'loop' times calls back to back (the mean, as "
                             "nccl-tests does); 'barrier' starts every call from a barrier and "
                             "takes the median of the slowest rank's times")
    parser.add_argument("--iterations", type=int, default=None,
                        help="latency: round trips (2000); fusion: repetitions (30)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="idle: how long to watch (5); autotune: timing per setting (3)")
    parser.add_argument("--sample-seconds", type=float, default=0.5,
                        help="autotune: HORA_AUTOTUNE_SAMPLE_SECONDS for the search (0.5)")
    parser.add_argument("--autotune-log", help="autotune: HORA_AUTOTUNE_LOG for the search")
    parser.add_argument("--process-set", metavar="RANKS",
                        help="run the sweep or latency inside a process set of these ranks "
                             "(comma-separated, e.g. 0,1): hora in the set, MPI on a "
                             "communicator of the same ranks; the other ranks wait")
    parser.add_argument("--idle-set", metavar="RANKS",
                        help="latency: also measure the global set's round trip with a second "
                             "process set of these ranks registered but idle, against none")
    parser.add_argument("--busy-set", metavar="RANKS",
                        help="with --process-set: these other ranks, in a set of their own, "
                             "run large allreduces all the while (does the measured set wait "
                             "for their traffic?); idle: these ranks, in a set, run small "
                             "allreduces while every rank's CPU is measured")
    parser.add_argument("--busy-bytes", type=int, default=16 << 20,
                        help="--busy-set: bytes of each of its allreduces (default 16 MiB)")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--plot", help="sweeps: draw busbw against size into this PNG")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "torch-synthetic":
        from hora.bench import torch_synthetic  # needs torch, which the others do not
        return torch_synthetic.main(argv[1:])
    if argv and argv[0] == "host-cost":
        from hora.bench import host_cost  # needs torch
        return host_cost.main(argv[1:])
    if argv and argv[0] == "sharding":
        from hora.bench import sharding  # needs torch
        return sharding.main(argv[1:])
    if argv and argv[0] == "tf-synthetic":
        from hora.bench import tf_synthetic  # needs TensorFlow
        return tf_synthetic.main(argv[1:])
    if argv and argv[0] == "elastic":
        from hora.bench import elastic  # launches its own jobs; needs torch
        return elastic.main(argv[1:])
    if argv and argv[0] == "negotiation":
        from hora.bench import negotiation  # one process, no launcher
        return negotiation.main(argv[1:])
    if argv and argv[0] == "multihost":
        from hora.bench import multihost  # builds namespaces, launches its own job
        return multihost.main(argv[1:])
    if argv and argv[0] == "compression":
        from hora.bench import compression  # builds namespaces, launches its own jobs
        return compression.main(argv[1:])
    if argv and argv[0] == "gpu-allreduce":
        from hora.bench import gpu_allreduce  # needs torch and a CUDA build
        return gpu_allreduce.main(argv[1:])
    if argv and argv[0] == "gpu-kernels":
        from hora.bench import gpu_kernels  # needs torch and a CUDA build
        return gpu_kernels.main(argv[1:])
    args = build_parser().parse_args(argv)
    args.compare = [c for c in args.compare.split(",") if c and c != "hora"]
    args.collective = args.benchmark

    dynamic = bool(args.process_set or args.idle_set or args.busy_set)
    hora.init(process_sets="dynamic" if dynamic else None)
    world = bench_world.world()  # MPI's, or hora's without an MPI job
    comm = world
    if args.idle_set:
        if args.benchmark != "latency":
            raise SystemExit("--idle-set is a latency option")
        args.idle_set = parse_ranks(args.idle_set, "--idle-set", world.Get_size())
    if args.process_set and args.benchmark in ("autotune", "idle"):
        raise SystemExit("--process-set applies to the size sweeps, latency and fusion")
    if args.busy_set and not args.process_set and args.benchmark != "idle":
        raise SystemExit("--busy-set goes with --process-set (the ranks that measure) or idle")
    if args.busy_set and args.benchmark == "idle":
        args.busy_set = parse_ranks(args.busy_set, "--busy-set", world.Get_size())
    if args.process_set:
        global LOG_RANK
        ranks = parse_ranks(args.process_set, "--process-set", world.Get_size())
        process_set = hora.add_process_set(ranks)
        busy_ranks = parse_ranks(args.busy_set, "--busy-set", world.Get_size()) \
            if args.busy_set else []
        if set(busy_ranks) & set(ranks):
            raise SystemExit("--busy-set and --process-set must not share ranks")
        busy = hora.add_process_set(busy_ranks) if busy_ranks else None
        member = world.Get_rank() in ranks
        comm = world.Split(0 if member else MPI.UNDEFINED, world.Get_rank())
        LOG_RANK = ranks[0]
        log(f"# inside process set {ranks} ({len(ranks)} of {world.Get_size()} ranks)" +
            (f"; process set {busy_ranks} allreduces {args.busy_bytes} bytes meanwhile"
             if busy else ""))
        if not member:  # the other ranks wait for the measured ones (or keep busy)
            done = world.Ibarrier()
            rounds = 0
            if busy is not None and world.Get_rank() in busy_ranks:
                load = np.full(args.busy_bytes // 4, 1e-30, np.float32)
                while not busy_signal(busy, done):
                    hora.allreduce_(load, name="bench.busy", op=hora.Sum, process_set=busy)
                    rounds += 1
            done.Wait()
            if busy is not None and world.Get_rank() == busy_ranks[0]:
                print(f"# the busy set ran {rounds} allreduces of {args.busy_bytes} bytes",
                      flush=True)
            world.Barrier()  # nobody shuts hora down while a busy set still runs
            hora.shutdown()
            return 0
        implementations.SCOPE = implementations.Scope(comm, process_set)
    if args.benchmark == "latency":
        args.iterations = args.iterations or 2000
        rows = run_latency(args, comm)
    elif args.benchmark == "fusion":
        args.iterations = args.iterations or 30
        rows = run_fusion(args, comm)
    elif args.benchmark == "autotune":
        from hora.bench import autotune
        args.seconds = args.seconds or 3.0
        rows = autotune.run(args, comm, log)
    elif args.benchmark == "idle":
        from hora.bench import idle
        args.seconds = args.seconds or 5.0
        rows = idle.run(args, comm, log)
    else:
        rows = run_sweep(args, comm)
    if args.process_set:
        world.Ibarrier().Wait()  # the busy set may stop now
        world.Barrier()
    if comm.Get_rank() == 0:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"benchmark": args.benchmark, "ranks": comm.Get_size(), "rows": rows},
                          f, indent=1)
        if args.plot and args.benchmark in BUS_FACTORS:
            plot(rows, args.plot)
    hora.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
