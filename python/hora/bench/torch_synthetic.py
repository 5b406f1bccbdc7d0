"""python -m hora.bench torch-synthetic: images/sec of data-parallel training.

Modelled on Horovod's examples/pytorch/pytorch_synthetic_benchmark.py: a
ResNet trains on one fixed random batch per rank with
hora.torch.DistributedOptimizer (parameters and optimizer state broadcast
from rank 0 first), a number of warm-up batches is discarded, then
--num-iters iterations of --num-batches-per-iter batches are timed and the
mean images/sec with +-1.96 standard deviations over the iterations is
printed per rank and in total.

On top of that, every iteration also times the same training step on a
copy of the model with the plain optimizer and no communication at all
("compute-only"), on all ranks at the same moment. Both variants then share
the machine's cores in the same way, so their ratio is what communication
(and hora's engine thread) costs. With several ranks, rank 0 finally times
the compute-only step while the other ranks sleep; size x that number is
what perfect scaling would give if every rank had the machine to itself,
so the second efficiency also charges for ranks sharing cores and memory
bandwidth, which ranks on separate hosts would not.
"""

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import hora.torch as hvd
from hora.bench import small_resnet


def build_parser():
    """The command line of ``python -m hora.bench torch-synthetic``."""
    parser = argparse.ArgumentParser(prog="python -m hora.bench torch-synthetic",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="resnet20", choices=sorted(small_resnet.MODELS),
                        help="resnet20: 0.27 M parameters, 32x32 images; resnet18: 11.7 M "
                             "parameters (ImageNet layout)")
    parser.add_argument("--batch-size", type=int, default=32, help="images per rank and batch")
    parser.add_argument("--image-size", type=int, default=None,
                        help="height and width of the images (default: 32 for resnet20, 64 for "
                             "resnet18)")
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="batches of each variant run before timing starts")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="batches timed together as one measurement")
    parser.add_argument("--num-iters", type=int, default=10,
                        help="measurements to take")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16 (hvd.Compression.fp16)")
    parser.add_argument("--groups", type=int, default=0,
                        help="DistributedOptimizer(groups=N): reduce the gradients in N fused "
                             "groups instead of one allreduce per parameter (0, as Horovod's "
                             "script does)")
    parser.add_argument("--sync-batch-norm", action="store_true",
                        help="hvd.SyncBatchNorm in the distributed model, as Horovod's script "
                             "uses (the compute-only copy keeps torch.nn.BatchNorm2d)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: the host's cores divided by the "
                             "ranks on it, at most the cores the launcher bound the rank to, "
                             "at least 1)")
    parser.add_argument("--json", help="rank 0 writes the results to this file")
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
    return args


def settings():
    """The HORA_*/HOROVOD_* tuning variables in effect (not the launcher's
    rank and size variables)."""
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith(("HORA_", "HOROVOD_"))
            and not name.endswith(("RANK", "SIZE", "HOSTNAME"))}


def training_step(model, optimizer, data, target):
    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
    return step


def images_per_second(step, batches, batch_size):
    start = time.perf_counter()
    for _ in range(batches):
        step()
    return batches * batch_size / (time.perf_counter() - start)


def sleeping_barrier(comm):
    """A barrier that waits in time.sleep instead of MPI's busy polling, so
    waiting ranks leave the cores to the rank being timed."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def summary(per_iteration):
    """mean and 1.96 standard deviations over iterations, as Horovod prints."""
    values = np.asarray(per_iteration, dtype=np.float64)
    return float(values.mean()), float(1.96 * values.std())


def run(args):
    hvd.init()
    comm = MPI.COMM_WORLD
    rank, size = hvd.rank(), hvd.size()
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0))  # fewer than cores when the launcher binds ranks
    threads = args.threads or max(1, min(usable, cores // hvd.local_size()))
    torch.set_num_threads(threads)
    image_size = args.image_size or small_resnet.default_image_size(args.model)

    def log(message):
        if rank == 0:
            print(message, flush=True)

    norm = hvd.SyncBatchNorm if args.sync_batch_norm else torch.nn.BatchNorm2d
    torch.manual_seed(0)
    model = small_resnet.build(args.model, norm)
    local_model = small_resnet.build(args.model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average,
                                         groups=args.groups)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    local_model.load_state_dict(model.state_dict())
    local_optimizer = torch.optim.SGD(local_model.parameters(), lr=0.01 * size)

    generator = torch.Generator().manual_seed(1000 + rank)
    data = torch.randn(args.batch_size, 3, image_size, image_size, generator=generator)
    target = torch.randint(0, small_resnet.num_classes(args.model), (args.batch_size,),
                           generator=generator)
    distributed = training_step(model, optimizer, data, target)
    compute_only = training_step(local_model, local_optimizer, data, target)

    parameters = sum(p.numel() for p in model.parameters())
    log(f"Model: {args.model} ({parameters / 1e6:.2f} M parameters, "
        f"{parameters * 4 / 2**20:.1f} MiB of float32 gradients), {image_size}x{image_size} "
        f"images")
    log(f"Batch size: {args.batch_size} per rank")
    log(f"Number of CPUs (ranks): {size}, {threads} torch thread(s) each, rank 0 may run on "
        f"{usable} of the host's {cores} core(s); allreduce "
        f"{'float16' if args.fp16_allreduce else 'float32'}, "
        f"{f'{args.groups} group(s)' if args.groups else 'one per parameter'}; "
        f"{'hvd.SyncBatchNorm' if args.sync_batch_norm else 'BatchNorm2d'}")
    if args.sync_batch_norm:
        log("Note: the compute-only copy keeps BatchNorm2d, so the efficiency below also charges "
            "for hvd.SyncBatchNorm's own arithmetic, not only for its communication")
    if settings():
        log("Settings: " + " ".join(f"{k}={v}" for k, v in settings().items()))
    if threads * hvd.local_size() > cores:
        log(f"Note: {threads * hvd.local_size()} torch threads on {cores} cores: the ranks "
            f"oversubscribe the host")

    log(f"Running warmup ({args.num_warmup_batches} batches of each variant)...")
    for _ in range(args.num_warmup_batches):
        distributed()
        compute_only()

    log("Running benchmark...")
    mine = {"distributed": [], "compute_only": []}
    for iteration in range(args.num_iters):
        comm.Barrier()
        mine["compute_only"].append(
            images_per_second(compute_only, args.num_batches_per_iter, args.batch_size))
        comm.Barrier()
        mine["distributed"].append(
            images_per_second(distributed, args.num_batches_per_iter, args.batch_size))
        log(f"Iter #{iteration}: {mine['distributed'][-1]:.1f} img/sec per CPU distributed, "
            f"{mine['compute_only'][-1]:.1f} compute-only (rank 0)")

    alone = None
    if size > 1:
        log("Timing compute-only on rank 0 alone (the other ranks sleep)...")
        sleeping_barrier(comm)
        if rank == 0:
            alone = [images_per_second(compute_only, args.num_batches_per_iter, args.batch_size)
                     for _ in range(args.num_iters)]
        sleeping_barrier(comm)

    everyone = comm.gather(mine, root=0)
    if rank == 0:
        report(args, everyone, alone, size, threads, (cores, usable), image_size, parameters)
    hvd.shutdown()
    return 0


def report(args, everyone, alone, size, threads, host, image_size, parameters):
    cores, usable = host
    results = {"benchmark": "torch-synthetic", "model": args.model, "parameters": parameters,
               "image_size": image_size, "batch_size": args.batch_size, "ranks": size,
               "threads_per_rank": threads, "host_cores": cores,
               "rank0_usable_cores": usable,
               "fp16_allreduce": args.fp16_allreduce, "groups": args.groups,
               "sync_batch_norm": args.sync_batch_norm, "settings": settings(),
               "num_warmup_batches": args.num_warmup_batches,
               "num_batches_per_iter": args.num_batches_per_iter, "num_iters": args.num_iters}
    for variant, label in (("distributed", "distributed"), ("compute_only", "compute-only")):
        per_rank = [summary(r[variant]) for r in everyone]
        total = summary(np.sum([r[variant] for r in everyone], axis=0))
        results[variant] = {"per_rank_img_sec": [m for m, _ in per_rank],
                            "per_rank_conf": [c for _, c in per_rank],
                            "total_img_sec": total[0], "total_conf": total[1]}
        mean_rank = summary([v for r in everyone for v in r[variant]])
        print(f"Img/sec per CPU, {label}: {mean_rank[0]:.1f} +-{mean_rank[1]:.1f}  (ranks: "
              + ", ".join(f"{m:.1f}" for m, _ in per_rank) + ")")
        print(f"Total img/sec on {size} CPU(s), {label}: {total[0]:.1f} +-{total[1]:.1f}")
    print("(+- is 1.96 standard deviations of the per-iteration rates, as Horovod prints it)")
    distributed = results["distributed"]["total_img_sec"]
    efficiency = distributed / results["compute_only"]["total_img_sec"]
    results["efficiency_vs_compute_only"] = efficiency
    print(f"Efficiency against compute-only on the same ranks at the same time: "
          f"{efficiency * 100:.1f}%  (the cost of communication and hora's engine; both "
          f"variants share the cores alike)")
    if alone is not None:
        alone_mean, alone_conf = summary(alone)
        scaling = distributed / (size * alone_mean)
        results["alone_img_sec"], results["alone_conf"] = alone_mean, alone_conf
        results["scaling_efficiency_vs_alone"] = scaling
        print(f"One rank alone, compute-only ({threads} thread(s), the others asleep): "
              f"{alone_mean:.1f} +-{alone_conf:.1f} img/sec")
        print(f"Scaling efficiency against {size} x one rank alone: {scaling * 100:.1f}%  "
              f"(also charges for the ranks sharing this host's {cores} core(s) and memory, "
              f"which ranks on separate hosts would not; anything else running on the host "
              f"skews both numbers)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def main(argv=None):
    return run(parse(argv))
