"""python -m hora.bench host-cost: what a collective costs the host per
tensor, beyond the bytes it moves.

Run it under the launcher (``horarun -np 2 python -m hora.bench host-cost``).
For each set of tensors (``tiny``: 161 tensors of 4 floats; ``resnet50``: the
161 gradient shapes of ResNet-50, 25.6 M floats) it times, interleaved and
from a barrier each time, the slowest rank counting:

* ``flat``: one ``hvd.allreduce`` of a tensor holding all the elements, and
  ``flat_`` its in-place form: the references;
* ``grouped``: ``hvd.grouped_allreduce`` of the tensors (new tensors back);
* ``grouped_``: ``hvd.grouped_allreduce_`` (in place, DistributedOptimizer's
  path for a bucket);
* ``async``: ``hvd.allreduce_async_`` per tensor, then ``synchronize`` on
  each, as Horovod scripts do without grouping;
* with ``--compare gloo``, the same flat tensor and the same per-tensor loop
  through ``torch.distributed`` on gloo (``all_reduce(async_op=True)``),
  divided by the world size as hora's Average does; timed after hora's, so
  that neither library's threads slow the other's.

It reports the median time of each and, per tensor, the time above the flat
reference of the same kind (out of place, or in place): the host's cost of
handing the data over as many tensors rather than one. Every variant's
results are checked afterwards (``wrong``: elements that are not the
average).
"""

import argparse
import json
import os

import torch
from mpi4py import MPI

from hora.bench.resnet50 import gradient_shapes
from hora.bench.timing import timed_interleaved

SHAPE_SETS = {
    "tiny": lambda: [(4,)] * 161,
    "resnet50": gradient_shapes,
}


def build_parser():
    """The command line of ``python -m hora.bench host-cost``."""
    parser = argparse.ArgumentParser(prog="python -m hora.bench host-cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,resnet50",
                        help="comma-separated tensor sets: " + ", ".join(SHAPE_SETS))
    parser.add_argument("--iterations", type=int, default=0,
                        help="timed rounds per set (default: 300 for tiny, 15 for resnet50)")
    parser.add_argument("--compare", default="",
                        help="'gloo': torch.distributed's flat and per-tensor allreduces too")
    parser.add_argument("--json", help="write the results to this file")
    return parser


def _gloo(comm):
    import torch.distributed as dist
    port = comm.bcast(29500 + os.getpid() % 2000 if comm.Get_rank() == 0 else None)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=comm.Get_rank(), world_size=comm.Get_size())
    return dist


def wrong_elements(results):
    """Elements of a variant's results that are not the average of every
    rank's 1e-3 (every variant reduces values that stay 1e-3)."""
    return sum(int((t - 1e-3).abs().gt(1e-9).sum()) for t in results)


def _make(shape):
    # tiny values keep repeated in-place averages finite and away from
    # denormals; zeros would let the kernel share one zero page
    return torch.full(shape, 1e-3)


def _gloo_variants(dist, shapes):
    tensors = [_make(s) for s in shapes]
    flat = _make((sum(t.numel() for t in tensors),))

    def per_tensor():
        for work in [dist.all_reduce(t, async_op=True) for t in tensors]:
            work.wait()
        for t in tensors:  # gloo has no average: what hora's Average does
            t.div_(dist.get_world_size())
        return tensors

    def flat_average():
        dist.all_reduce(flat)
        return [flat.div_(dist.get_world_size())]
    return ({"gloo flat_": flat_average, "gloo async": per_tensor},
            {"gloo flat_": None, "gloo async": "gloo flat_"})


def _variants(hvd, shapes):
    make = _make
    tensors = [make(s) for s in shapes]
    in_place = [make(s) for s in shapes]
    total = sum(t.numel() for t in tensors)
    flat, flat_in_place = make((total,)), make((total,))

    def per_tensor():
        handles = [hvd.allreduce_async_(t, name=f"bench.async.{i}", op=hvd.Average)
                   for i, t in enumerate(in_place)]
        for h in handles:
            hvd.synchronize(h)

    variants = {
        "flat": lambda: [hvd.allreduce(flat, name="bench.flat", op=hvd.Average)],
        "flat_": lambda: [hvd.allreduce_(flat_in_place, name="bench.flat_", op=hvd.Average)],
        "grouped": lambda: hvd.grouped_allreduce(tensors, name="bench.grouped",
                                                 op=hvd.Average),
        "grouped_": lambda: hvd.grouped_allreduce_(in_place, name="bench.grouped_",
                                                   op=hvd.Average),
        "async": lambda: (per_tensor(), in_place)[1],
    }
    reference = {"flat": None, "flat_": None, "grouped": "flat", "grouped_": "flat_",
                 "async": "flat_"}
    return variants, reference, total


def main(argv=None):
    args = build_parser().parse_args(argv)
    import hora.torch as hvd
    hvd.init()
    comm = MPI.COMM_WORLD
    dist = _gloo(comm) if "gloo" in args.compare.split(",") else None
    rows = []
    for set_name in [s for s in args.shapes.split(",") if s]:
        if set_name not in SHAPE_SETS:
            raise SystemExit(f"unknown --shapes entry {set_name!r}; choose from "
                             + ", ".join(SHAPE_SETS))
        shapes = SHAPE_SETS[set_name]()
        variants, reference, total = _variants(hvd, shapes)
        iterations = args.iterations or (300 if set_name == "tiny" else 15)
        names = list(variants)
        seconds = dict(zip(names, timed_interleaved([variants[n] for n in names], iterations,
                                                    comm)))
        if dist is not None:
            # timed apart: each library's threads would slow the other's
            gloo, gloo_reference = _gloo_variants(dist, shapes)
            gloo_names = list(gloo)
            seconds.update(zip(gloo_names, timed_interleaved([gloo[n] for n in gloo_names],
                                                             iterations, comm)))
            names += gloo_names
            reference.update(gloo_reference)
        checked = {**variants, **(gloo if dist is not None else {})}
        wrong = {name: comm.allreduce(wrong_elements(checked[name]())) for name in names}
        if comm.Get_rank() == 0:
            print(f"# {set_name}: {len(shapes)} tensors, {total * 4 / 2**20:.2f} MiB float32, "
                  f"{comm.Get_size()} ranks, {iterations} rounds (median)", flush=True)
        for name in names:
            ref = reference[name]
            above = None if ref is None else (seconds[name] - seconds[ref]) / len(shapes)
            rows.append({"set": set_name, "variant": name, "ranks": comm.Get_size(),
                         "tensors": len(shapes), "us": seconds[name] * 1e6,
                         "reference": ref, "wrong": wrong[name],
                         "us_per_tensor_above": None if above is None else above * 1e6})
            if comm.Get_rank() == 0:
                extra = "" if above is None else f"   {above * 1e6:6.2f} us per tensor above {ref}"
                flag = f"   #wrong {wrong[name]}" if wrong[name] else ""
                print(f"  {name:>11}  {seconds[name] * 1e6:10.1f} us{extra}{flag}", flush=True)
    if comm.Get_rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "host-cost", "rows": rows}, f, indent=1)
    if dist is not None:
        dist.destroy_process_group()
    hvd.shutdown()
    return 0
