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
import os
from types import SimpleNamespace

import numpy as np
import torch
from mpi4py import MPI

import hora
import hora.torch as hvd
from hora.bench import synthetic, train_models, train_variants


def build_parser():
    """The command line of ``python -m hora.bench torch-synthetic``."""
    parser = argparse.ArgumentParser(prog="python -m hora.bench torch-synthetic",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    synthetic.add_model_options(parser, train_models)
    parser.add_argument("--compare", default="",
                        help="comma-separated alternatives trained in the same job: ddp "
                             "(torch DistributedDataParallel, gloo on CPU), horovod, "
                             "hora_per_gradient (hora with bucket_bytes=0), hora_whole_graph "
                             "(with --compile: hora under plain torch.compile)")
    synthetic.add_timing_options(parser)
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16 (hvd.Compression.fp16; DDP gets "
                             "fp16_compress_hook)")
    parser.add_argument("--groups", type=int, default=0,
                        help="DistributedOptimizer(groups=N): reduce the gradients in N fused "
                             "groups (0: hora's default)")
    parser.add_argument("--sync-batch-norm", action="store_true",
                        help="hvd.SyncBatchNorm in hora's model, as Horovod's script uses (the "
                             "other variants keep torch.nn.BatchNorm2d)")
    parser.add_argument("--compile", action="store_true",
                        help="train every variant's model through torch.compile (hora's "
                             "through hora.torch.compile, DDP's through its DDPOptimizer); the "
                             "warm-up batches compile it")
    parser.add_argument("--count-bytes", metavar="INTERFACE", default=None,
                        help="count the bytes each rank's host sends through this network "
                             "interface per batch, for every variant (e.g. eth0 of a pretend "
                             "host; the compression benchmark passes it)")
    parser.add_argument("--cuda", action="store_true",
                        help="train on the GPU of the rank's local rank")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads per rank (default: the host's cores divided by the "
                             "ranks on it, at most the cores the launcher bound the rank to, "
                             "at least 1)")
    synthetic.add_output_options(parser, "images/sec")
    return parser


def parse(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    synthetic.check_counts(parser, args)
    if args.groups < 0:
        parser.error("--groups must not be negative")
    args.compare = synthetic.parse_compare(parser, args.compare, train_variants.KNOWN)
    if args.cuda and not torch.cuda.is_available():
        parser.error("--cuda: torch sees no GPU")
    if args.count_bytes:
        try:
            synthetic.sent_bytes(args.count_bytes)
        except ValueError as error:
            parser.error(f"--count-bytes: {error}")
    return args


def settings():
    """The HORA_*/HOROVOD_* tuning variables in effect (not the launcher's
    rank and size variables)."""
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith(("HORA_", "HOROVOD_"))
            and not name.endswith(("RANK", "SIZE", "HOSTNAME"))}


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
    variants = synthetic.usable_variants(
        [train_variants.Hora(setup), train_variants.ComputeOnly(setup)], train_variants.KNOWN,
        args.compare, setup, log)

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

    everyone, alone, spreads = synthetic.measure_all(
        variants, lambda: train_variants.ComputeOnly(setup), args, comm, log)
    sent = comm.gather({v.name: v.sent_per_batch for v in variants if v.sent_per_batch},
                       root=0)
    if rank == 0:
        context = {"size": size, "threads": threads, "cores": cores, "usable": usable,
                   "image_size": image_size, "parameters": parameters, "gradients": gradients,
                   "device": str(device)}
        results = report(args, everyone, alone, spreads, context)
        if args.count_bytes:
            results["sent_bytes_per_batch"] = report_sent(sent, args.count_bytes)
        synthetic.write(results, args, f"{results['model']}, batch {results['batch_size']}/rank, "
                                       f"{results['ranks']} ranks ({results['device']})", "ddp")
    hvd.shutdown()
    return 0


PAIRS = [("hora", "compute_only"), ("hora", "ddp"), ("hora", "horovod"),
         ("hora", "hora_per_gradient"), ("hora_per_gradient", "compute_only"),
         ("ddp", "compute_only")]


def report(args, everyone, alone, spreads, context):
    results = {"benchmark": "torch-synthetic", "model": args.model,
               "parameters": context["parameters"], "gradients": context["gradients"],
               "image_size": context["image_size"], "batch_size": args.batch_size,
               "ranks": context["size"], "device": context["device"],
               "threads_per_rank": context["threads"], "host_cores": context["cores"],
               "rank0_usable_cores": context["usable"],
               "fp16_allreduce": args.fp16_allreduce, "groups": args.groups,
               "sync_batch_norm": args.sync_batch_norm, "settings": settings(),
               "hora_version": hora.__version__,
               "torch_version": torch.__version__,
               "num_warmup_batches": args.num_warmup_batches,
               "num_batches_per_iter": args.num_batches_per_iter, "num_iters": args.num_iters}
    return synthetic.report(results, everyone, alone, spreads, PAIRS)


def report_sent(sent, interface):
    """Each variant's bytes sent per batch (median over its blocks), per
    rank's host, printed and returned."""
    out = {}
    print(f"Bytes sent through {interface} per batch, median over the timed blocks, per rank:")
    for name in sent[0]:
        per_rank = [float(np.median(rank_sent[name])) for rank_sent in sent]
        out[name] = per_rank
        print(f"  {name:<22} " + ", ".join(f"{b / 2**20:.3f} MiB" for b in per_rank))
    return out


def main(argv=None):
    return run(parse(argv))
