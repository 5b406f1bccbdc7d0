"""python -m hora.bench gpu-allreduce: hora's allreduce of CUDA tensors against
torch.distributed with NCCL on the same tensors, in one job.

Each case is timed for every variant in turn within every iteration (so drift
in the machine's speed hits them alike), from a barrier to the moment the GPU
has finished (``torch.cuda.synchronize``); the slowest rank's time counts and
the median over iterations is reported:

- ``hora``: ``hvd.allreduce_`` of the tensor, or ``hvd.grouped_allreduce_``
  of the 161 ResNet-50 gradients (what ``DistributedOptimizer`` submits);
- ``hora async``: the 161 gradients as separate ``allreduce_async_`` calls,
  fused by the engine (Horovod's way);
- ``nccl``: ``torch.distributed.all_reduce`` (ProcessGroupNCCL) on each tensor;
- ``nccl flat``: one ``all_reduce`` of a buffer as large as the 161
  gradients together: raw NCCL with perfect fusion and no copies, the floor.

``added`` is hora's median minus raw NCCL's (the best NCCL variant), and
``overhead`` that difference over NCCL's time. Run under the launcher with
one GPU per rank (``horarun -np 2 python -m hora.bench gpu-allreduce``), or
as one plain process for one rank. NCCL refuses two ranks on one GPU, so on a
one-GPU machine only the one-rank comparison exists.
"""

import argparse
import json
import os
import statistics
import time

from mpi4py import MPI


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hora.bench gpu-allreduce",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,1048576,67108864",
                        help="bytes of the single-tensor cases, comma-separated "
                             "(default 8 B, 1 MiB, 64 MiB)")
    parser.add_argument("--no-resnet50", action="store_true",
                        help="leave out the case of the 161 ResNet-50 gradients")
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="rough time each variant spends on each case (default 1.5)")
    parser.add_argument("--json", help="rank 0 writes the results to this file")
    return parser


def _init_torch_distributed(hvd, dist, torch):
    from hora.bench.implementations import _free_port
    port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, root_rank=0,
                                name="bench.gpu_allreduce.port")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("nccl", rank=hvd.rank(), world_size=hvd.size(),
                            device_id=torch.device("cuda", hvd.local_rank()))


def _timed_interleaved(variants, iterations, comm, torch):
    """Median seconds of each variant (run in turn every iteration, each
    from a barrier until the GPU is done; the slowest rank counts)."""
    for fn in variants.values():  # warm-up: NCCL and the engine set up here
        fn()
        fn()
    torch.cuda.synchronize()
    samples = {name: [] for name in variants}
    for _ in range(iterations):
        for name, fn in variants.items():
            comm.Barrier()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            samples[name].append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return {name: (statistics.median(s), min(s), max(s)) for name, s in samples.items()}


def _cases(args, torch):
    from hora.bench import resnet50
    cases = []
    for text in args.sizes.split(","):
        size = int(text)
        count = max(1, size // 4)
        cases.append((f"{size} B", size, [torch.rand(count, device="cuda")]))
    if not args.no_resnet50:
        shapes = resnet50.gradient_shapes()
        grads = [torch.rand(shape, device="cuda") for shape in shapes]
        total = sum(g.numel() for g in grads) * 4
        cases.append((f"ResNet-50 ({len(grads)} tensors)", total, grads))
    return cases


def _variants(name, tensors, hvd, dist, torch):
    variants = {}
    if len(tensors) == 1:
        t = tensors[0]
        variants["hora"] = lambda: hvd.allreduce_(t, op=hvd.Sum, name=f"bench.{name}")
        variants["nccl"] = lambda: dist.all_reduce(t)
        return variants
    names = [f"bench.{name}.{k}" for k in range(len(tensors))]
    flat = torch.rand(sum(t.numel() for t in tensors), device="cuda")

    def hora_async():
        handles = [hvd.allreduce_async_(t, op=hvd.Sum, name=n) for t, n in zip(tensors, names)]
        for handle in handles:
            hvd.synchronize(handle)

    def nccl_each():
        for t in tensors:
            dist.all_reduce(t)

    variants["hora"] = lambda: hvd.grouped_allreduce_(tensors, op=hvd.Sum, name=f"bench.{name}")
    variants["hora async"] = hora_async
    variants["nccl"] = nccl_each
    variants["nccl flat"] = lambda: dist.all_reduce(flat)
    return variants


def run(args):
    import torch
    import torch.distributed as dist

    import hora.torch as hvd

    if not torch.cuda.is_available():
        raise SystemExit("gpu-allreduce needs a GPU that PyTorch can see")
    hvd.init()
    if not hvd.cuda_built():
        raise SystemExit("gpu-allreduce needs a CUDA build of hora: HORA_WITH_CUDA=1 pip install .")
    torch.cuda.set_device(hvd.local_rank())
    _init_torch_distributed(hvd, dist, torch)
    comm = MPI.COMM_WORLD
    device = torch.cuda.get_device_name()
    if hvd.rank() == 0:
        print(f"# GPU allreduce, {hvd.size()} rank(s) on {device}: hora against "
              f"torch.distributed NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; "
              f"median (min-max) µs per call, to GPU completion", flush=True)
    rows = []
    for label, size, tensors in _cases(args, torch):
        # a quick probe sizes the loop to about args.seconds per variant
        variants = _variants(label.replace(" ", "_"), tensors, hvd, dist, torch)
        probe = _timed_interleaved(variants, 3, comm, torch)
        slowest = max(m for m, _, _ in probe.values())
        iterations = max(10, min(2000, int(args.seconds / max(slowest, 1e-6))))
        iterations = comm.bcast(iterations, root=0)
        timed = _timed_interleaved(variants, iterations, comm, torch)
        nccl = min(timed[k][0] for k in timed if k.startswith("nccl"))
        row = {"case": label, "bytes": size, "tensors": len(tensors), "iterations": iterations,
               "ranks": hvd.size(), "device": device,
               "us": {k: {"median": m * 1e6, "min": lo * 1e6, "max": hi * 1e6}
                      for k, (m, lo, hi) in timed.items()},
               "added_us": (timed["hora"][0] - nccl) * 1e6,
               "overhead": timed["hora"][0] / nccl - 1.0}
        rows.append(row)
        if hvd.rank() == 0:
            parts = "  ".join(f"{k} {m * 1e6:.1f} ({lo * 1e6:.1f}-{hi * 1e6:.1f})"
                              for k, (m, lo, hi) in timed.items())
            print(f"  {label:>26}: {parts}  added {row['added_us']:+.1f} µs "
                  f"({row['overhead']:+.1%})", flush=True)
    if hvd.rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "gpu-allreduce", "ranks": hvd.size(), "device": device,
                       "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    hvd.shutdown()
    return rows


def main(argv):
    run(build_parser().parse_args(argv))
    return 0
