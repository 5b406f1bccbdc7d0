"""python -m hora.bench torch-synthetic: images/sec of data-parallel training.

Modelled on Horovod's examples/pytorch/pytorch_synthetic_benchmark.py: a
model trains on one fixed random batch per rank with
hora.torch.DistributedOptimizer, a number of warm-up batches is discarded,
then --num-iters iterations of --num-batches-per-iter batches are timed.

Every iteration also times the same step on a copy of the model with the
plain optimizer and no communication ("compute-only"), and each variant
named by --compare (PyTorch DDP, Horovod), on all ranks at the same moment,
in alternating blocks whose order rotates from one iteration to the next:
drift in the machine's speed then hits every variant alike. Each iteration's
total images/sec (the sum over ranks) is one sample; the report gives the
median and the range of the samples, Horovod's mean +-1.96 standard
deviations, and the ratios of the variants taken per iteration. Horovod,
whose background thread polls while it is initialized, runs in a phase of
its own, alternating with compute-only again.

With several ranks, rank 0 finally times the compute-only step while the
other ranks sleep; size x that number is what perfect scaling would give if
every rank had the machine to itself.
"""

import argparse
import json
import os
import time
from types import SimpleNamespace

import numpy as np
import torch
from mpi4py import MPI

import hora
import hora.torch as hvd
from hora.bench import train_models, train_variants


def build_parser():
    """The command line of ``python -m hora.bench torch-synthetic``."""
    parser = argparse.ArgumentParser(prog="python -m hora.bench torch-synthetic",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="resnet20", choices=train_models.names(),
                        help="; ".join(f"{k}: {v}" for k, v in train_models.DESCRIPTIONS.items()))
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and batch")
    parser.add_argument("--image-size", type=int, default=None,
                        help="height and width of the images (default: 32 for resnet20, 64 for "
                             "resnet18)")
    parser.add_argument("--compare", default="",
                        help="comma-separated alternatives trained in the same job: ddp "
                             "(torch DistributedDataParallel, gloo on CPU), horovod, "
                             "hora_per_gradient (hora with bucket_bytes=0)")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="batches of each variant run before timing starts")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="batches timed together as one measurement")
    parser.add_argument("--num-iters", type=int, default=10,
                        help="measurements to take")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16 (hvd.Compression.fp16; DDP gets "
                             "fp16_compress_hook)")
    parser.add_argument("--groups", type=int, default=0,
                        help="DistributedOptimizer(groups=N): reduce the gradients in N fused "
                             "groups (0: hora's default)")
    parser.add_argument("--sync-batch-norm", action="store_true",
                        help="hvd.SyncBatchNorm in hora's model, as Horovod's script uses (the "
                             "other variants keep torch.nn.BatchNorm2d)")
    parser.add_argument("--cuda", action="store_true",
                        help="train on the GPU of the rank's local rank")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: the host's cores divided by the "
                             "ranks on it, at most the cores the launcher bound the rank to, "
                             "at least 1)")
    parser.add_argument("--json", help="rank 0 writes the results to this file")
    parser.add_argument("--plot", help="rank 0 draws the variants' images/sec to this PNG")
    return parser


def parse(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    for option in ("batch_size", "num_batches_per_iter", "num_iters"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    for option in ("num_warmup_batches", "groups"):
        if getattr(args, option) < 0:
            parser.error(f"--{option.replace('_', '-')} must not be negative")
    args.compare = [n.strip() for n in args.compare.split(",") if n.strip()]
    unknown = [n for n in args.compare if n not in train_variants.KNOWN]
    if unknown:
        parser.error(f"--compare: unknown {', '.join(unknown)}; choose from "
                     f"{', '.join(train_variants.KNOWN)}")
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda: torch sees no GPU")
    return args


def settings():
    """The HORA_*/HOROVOD_* tuning variables in effect (not the launcher's
    rank and size variables)."""
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith(("HORA_", "HOROVOD_"))
            and not name.endswith(("RANK", "SIZE", "HOSTNAME"))}


def images_per_second(variant, batches, batch_size, device):
    start = time.perf_counter()
    for _ in range(batches):
        variant.step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return batches * batch_size / (time.perf_counter() - start)


def sleeping_barrier(comm):
    """A barrier that waits in time.sleep instead of MPI's busy polling, so
    waiting ranks leave the cores to the rank being timed."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def summary(values):
    """median, range, and Horovod's mean +-1.96 standard deviations."""
    values = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(values)), "min": float(values.min()),
            "max": float(values.max()), "mean": float(values.mean()),
            "conf": float(1.96 * values.std())}


def parameter_spread(model, comm):
    """The largest difference of any parameter between ranks (0.0 when every
    rank holds the same weights)."""
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in model.parameters()])
    values = flat.numpy()
    high, low = np.empty_like(values), np.empty_like(values)
    comm.Allreduce(values, high, op=MPI.MAX)
    comm.Allreduce(values, low, op=MPI.MIN)
    return float((high - low).max()) if values.size else 0.0


def measure(phase, args, comm, log, device):
    """Times the phase's variants in alternating blocks; returns this rank's
    images/sec per variant and iteration."""
    for variant in phase:
        variant.start()
    try:
        log(f"Warm-up: {args.num_warmup_batches} batches of "
            + ", ".join(v.name for v in phase))
        for _ in range(args.num_warmup_batches):
            for variant in phase:
                variant.step()
        rates = {v.name: [] for v in phase}
        for iteration in range(args.num_iters):
            shift = iteration % len(phase)
            for variant in phase[shift:] + phase[:shift]:
                comm.Barrier()
                rates[variant.name].append(images_per_second(
                    variant, args.num_batches_per_iter, args.batch_size, device))
            log(f"Iter #{iteration}: " + ", ".join(
                f"{v.name} {rates[v.name][-1]:.1f}" for v in phase) + " img/sec (rank 0)")
        spreads = {v.name: parameter_spread(v.model, comm) for v in phase if v.synchronized}
        return rates, spreads
    finally:
        for variant in reversed(phase):
            variant.stop()


def run(args):
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = hvd.rank(), hvd.size()
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0))  # fewer than cores when the launcher binds ranks
    threads = args.threads or max(1, min(usable, cores // hvd.local_size()))
    torch.set_num_threads(threads)
    device = torch.device("cuda", hvd.local_rank()) if args.cuda else torch.device("cpu")
    if args.cuda:
        torch.cuda.set_device(device)
    image_size = args.image_size or train_models.default_image_size(args.model)

    def log(message):
        if rank == 0:
            print(message, flush=True)

    torch.manual_seed(0)
    initial = train_models.build(args.model)
    generator = torch.Generator().manual_seed(1000 + rank)
    data, target = train_models.batch(args.model, args.batch_size, image_size, generator)
    setup = SimpleNamespace(args=args, model=args.model, initial_state=initial.state_dict(),
                            data=data.to(device), target=target.to(device), device=device,
                            lr=0.01 * size)
    variants = [train_variants.Hora(setup), train_variants.ComputeOnly(setup)]
    for name in args.compare:
        variant = train_variants.KNOWN[name](setup)
        if variant.reason:
            log(f"# skipping {name}: {variant.reason}")
        else:
            variants.append(variant)
    quiet = [v for v in variants if not v.background]
    phases = [quiet] + [[v, train_variants.ComputeOnly(setup)] for v in variants if v.background]

    parameters = sum(p.numel() for p in initial.parameters())
    gradients = sum(1 for p in initial.parameters() if p.requires_grad)
    log(f"Model: {train_models.DESCRIPTIONS[args.model]}"
        + (f"; {image_size}x{image_size} images" if image_size else ""))
    log(f"Gradients: {gradients} tensors, {parameters * 4 / 2**20:.1f} MiB of float32")
    log(f"Batch size: {args.batch_size} per rank; device: {device}")
    log(f"Ranks: {size}, {threads} torch thread(s) each, rank 0 may run on {usable} of the "
        f"host's {cores} core(s); gradients sent as "
        f"{'float16' if args.fp16_allreduce else 'float32'}, "
        f"{f'{args.groups} group(s)' if args.groups else 'hora default grouping'}; "
        f"{'hvd.SyncBatchNorm' if args.sync_batch_norm else 'no SyncBatchNorm'}")
    log("Variants: " + "; ".join(f"{v.name} = {v.label}" for v in variants))
    if settings():
        log("Settings: " + " ".join(f"{k}={v}" for k, v in settings().items()))
    if threads * hvd.local_size() > cores:
        log(f"Note: {threads * hvd.local_size()} torch threads on {cores} cores: the ranks "
            f"oversubscribe the host")

    mine, spreads = [], {}
    for phase in phases:
        rates, spread = measure(phase, args, comm, log, device)
        mine.append(rates)
        spreads.update(spread)

    alone = None
    if size > 1:
        log("Timing compute-only on rank 0 alone (the other ranks sleep)...")
        sleeping_barrier(comm)
        if rank == 0:
            alone = [images_per_second(variants[1], args.num_batches_per_iter, args.batch_size,
                                       device) for _ in range(args.num_iters)]
        sleeping_barrier(comm)

    everyone = comm.gather(mine, root=0)
    if rank == 0:
        context = {"size": size, "threads": threads, "cores": cores, "usable": usable,
                   "image_size": image_size, "parameters": parameters, "gradients": gradients,
                   "device": str(device)}
        results = report(args, everyone, alone, spreads, context)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
        if args.plot:
            plot(results, args.plot)
    hvd.shutdown()
    return 0


def totals(everyone, phase, name):
    """Per-iteration images/sec summed over ranks, and each rank's median."""
    per_rank = np.asarray([rank_phases[phase][name] for rank_phases in everyone])
    return per_rank.sum(axis=0), [float(np.median(r)) for r in per_rank]


def report(args, everyone, alone, spreads, context):
    size = context["size"]
    results = {"benchmark": "torch-synthetic", "model": args.model,
               "parameters": context["parameters"], "gradients": context["gradients"],
               "image_size": context["image_size"], "batch_size": args.batch_size,
               "ranks": size, "device": context["device"],
               "threads_per_rank": context["threads"], "host_cores": context["cores"],
               "rank0_usable_cores": context["usable"],
               "fp16_allreduce": args.fp16_allreduce, "groups": args.groups,
               "sync_batch_norm": args.sync_batch_norm, "settings": settings(),
               "hora_version": hora.__version__,
               "torch_version": torch.__version__,
               "num_warmup_batches": args.num_warmup_batches,
               "num_batches_per_iter": args.num_batches_per_iter, "num_iters": args.num_iters,
               "variants": {}, "ratios": {}, "parameter_spread": spreads}
    print(f"Total img/sec on {size} rank(s), median [min-max] over {args.num_iters} "
          f"iterations, and Horovod's mean +-1.96 sd:")
    series = {}
    for phase, names in enumerate(everyone[0]):
        for name in names:
            total, per_rank = totals(everyone, phase, name)
            background = list(names)[0]
            key = name if phase == 0 or name != "compute_only" else f"{name}@{background}"
            series[key] = total
            stats = summary(total)
            stats["per_rank_median"] = per_rank
            stats["per_iteration"] = [float(v) for v in total]
            results["variants"][key] = stats
            print(f"  {key:<22} {stats['median']:8.1f} [{stats['min']:.1f}-{stats['max']:.1f}]"
                  f"   {stats['mean']:.1f} +-{stats['conf']:.1f}   (ranks: "
                  + ", ".join(f"{r:.1f}" for r in per_rank) + ")")
    pairs = [("hora", "compute_only"), ("hora", "ddp"), ("hora", "horovod"),
             ("hora", "hora_per_gradient"), ("hora_per_gradient", "compute_only"),
             ("ddp", "compute_only")]
    pairs += [(key.split("@")[1], key) for key in series if "@" in key]
    for a, b in pairs:
        if a in series and b in series:
            ratio = summary(series[a] / series[b])
            results["ratios"][f"{a}/{b}"] = ratio
            print(f"  {a} / {b}: {ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}] "
                  f"(per iteration)")
    if alone is not None:
        stats = summary(alone)
        results["alone"] = stats
        results["scaling_vs_alone"] = results["variants"]["hora"]["median"] / (
            size * stats["median"])
        print(f"One rank alone, compute-only (the others asleep): {stats['median']:.1f} img/sec; "
              f"hora's scaling efficiency against {size} x that: "
              f"{results['scaling_vs_alone'] * 100:.1f}% (also charges for the ranks sharing "
              f"the host's cores and memory)")
    for name, spread in spreads.items():
        print(f"Largest parameter difference between ranks after training, {name}: {spread:.3g}")
    return results


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results["variants"])
    stats = [results["variants"][n] for n in names]
    medians = [s["median"] for s in stats]
    errors = [[m - s["min"] for m, s in zip(medians, stats)],
              [s["max"] - m for m, s in zip(medians, stats)]]
    colors = {"hora": "tab:blue", "hora_per_gradient": "tab:cyan", "ddp": "tab:orange",
              "horovod": "tab:red", "compute_only": "tab:gray"}
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(names, medians, yerr=errors, capsize=4,
           color=[colors.get(n.split("@")[0], "tab:gray") for n in names])
    for x, m in enumerate(medians):
        ax.annotate(f"{m:.0f}", (x, m), ha="center", va="bottom", xytext=(8, 2),
                    textcoords="offset points")
    title = (f"{results['model']}, batch {results['batch_size']}/rank, {results['ranks']} ranks"
             f" ({results['device']})")
    ratio = results["ratios"].get("hora/ddp")
    if ratio:
        title += f"\nhora / DDP {ratio['median']:.2f} [{ratio['min']:.2f}-{ratio['max']:.2f}]"
    ax.set_title(title)
    ax.set_ylabel("images/sec, all ranks (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    return run(parse(argv))
