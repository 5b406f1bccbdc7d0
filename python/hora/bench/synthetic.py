"""What the synthetic training benchmarks (torch-synthetic, tf-synthetic)
share: timing the variants in alternating blocks, the statistics over
iterations and ranks, the report, and the plot.

A variant is one way of training the same model (hora, compute only, a
framework's own data parallelism, Horovod). It has ``name``, ``label``,
``reason`` (None when usable, else why not), ``background`` (a polling
thread while started: measured in a phase of its own), ``synchronized``
(whether its ranks must end with the same weights), ``start()``,
``stop()``, ``run(batches)`` (trains that many batches and returns when
they are done) and ``flat_weights()`` (every weight in one float64 NumPy
array).
"""

from __future__ import annotations

import json
import time

import numpy as np
from mpi4py import MPI

COLORS = {"hora": "tab:blue", "hora_per_gradient": "tab:cyan", "hora_tape": "tab:cyan",
          "ddp": "tab:orange", "mwms": "tab:orange", "horovod": "tab:red",
          "compute_only": "tab:gray", "hora_zero1": "tab:olive", "hora_zero2": "tab:green",
          "ddp_zero": "tab:orange", "fsdp2": "tab:brown"}


def add_model_options(parser, models):
    """--model (one of ``models``' names), --batch-size and --image-size."""
    parser.add_argument("--model", default="resnet20", choices=models.names(),
                        help="; ".join(f"{k}: {v}" for k, v in models.DESCRIPTIONS.items()))
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank and batch")
    parser.add_argument("--image-size", type=int, default=None,
                        help="height and width of the images (default: 32 for resnet20, 64 for "
                             "resnet18)")


def add_output_options(parser, unit):
    parser.add_argument("--json", help="rank 0 writes the results to this file")
    parser.add_argument("--plot", help=f"rank 0 draws the variants' {unit} to this PNG")


def add_timing_options(parser):
    """The warm-up, block and iteration counts every synthetic benchmark takes."""
    parser.add_argument("--num-warmup-batches", type=int, default=10,
                        help="batches of each variant run before timing starts")
    parser.add_argument("--num-batches-per-iter", type=int, default=10,
                        help="batches timed together as one measurement")
    parser.add_argument("--num-iters", type=int, default=10, help="measurements to take")


def check_counts(parser, args):
    for option in ("batch_size", "num_batches_per_iter", "num_iters"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    if args.num_warmup_batches < 0:
        parser.error("--num-warmup-batches must not be negative")


def parse_compare(parser, text, known, option="--compare"):
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"{option}: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return names


def summary(values):
    """median, range, and Horovod's mean +-1.96 standard deviations."""
    values = np.asarray(values, dtype=np.float64)
    return {"median": float(np.median(values)), "min": float(values.min()),
            "max": float(values.max()), "mean": float(values.mean()),
            "conf": float(1.96 * values.std())}


def sleeping_barrier(comm):
    """A barrier that waits in time.sleep instead of MPI's busy polling, so
    waiting ranks leave the cores to the rank being timed."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)


def samples_per_second(variant, batches, batch_size):
    start = time.perf_counter()
    variant.run(batches)
    return batches * batch_size / (time.perf_counter() - start)


def weight_spread(values, comm):
    """The largest difference of any weight between ranks (0.0 when every
    rank holds the same weights); ``values`` is this rank's flat float64 array."""
    high, low = np.empty_like(values), np.empty_like(values)
    comm.Allreduce(values, high, op=MPI.MAX)
    comm.Allreduce(values, low, op=MPI.MIN)
    return float((high - low).max()) if values.size else 0.0


def sent_bytes(interface):
    """Bytes this process's network namespace has sent through
    ``interface`` so far (``/proc/net/dev``); ValueError when it has no
    such interface."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if counters and name.strip() == interface:
                return int(counters.split()[8])
    raise ValueError(f"no network interface {interface!r} here (see /proc/net/dev)")


def measure(phase, args, comm, log):
    """Times the phase's variants in alternating blocks whose order rotates
    every iteration; returns this rank's samples/sec per variant and
    iteration, and the weight spread of the synchronized ones."""
    started = []
    try:
        for variant in phase:
            variant.start()
            started.append(variant)
        log(f"Warm-up: {args.num_warmup_batches} batches of " + ", ".join(v.name for v in phase))
        for variant in phase:
            variant.run(args.num_warmup_batches)
        rates = {v.name: [] for v in phase}
        for iteration in range(args.num_iters):
            shift = iteration % len(phase)
            for variant in phase[shift:] + phase[:shift]:
                comm.Barrier()
                interface = getattr(args, "count_bytes", None)
                before = sent_bytes(interface) if interface else 0
                rates[variant.name].append(
                    samples_per_second(variant, args.num_batches_per_iter, args.batch_size))
                if interface:
                    # counted, not estimated: what left this host per batch
                    variant.sent_per_batch.append(
                        (sent_bytes(interface) - before) / args.num_batches_per_iter)
            log(f"Iter #{iteration}: " + ", ".join(
                f"{v.name} {rates[v.name][-1]:.1f}" for v in phase) + " samples/sec (rank 0)")
        spreads = {v.name: weight_spread(v.flat_weights(), comm) for v in phase if v.synchronized}
        return rates, spreads
    finally:
        for variant in reversed(started):
            variant.stop()


def usable_variants(first, known, names, setup, log):
    """``first`` (hora and compute only) and the variants ``names`` picks
    from ``known``, each made from ``setup``; one that cannot run here is
    left out with its reason logged."""
    variants = list(first)
    for name in names:
        variant = known[name](setup)
        if variant.reason:
            log(f"# skipping {name}: {variant.reason}")
        else:
            variants.append(variant)
    return variants


def phases(variants, compute_only):
    """The quiet variants together, then each background one alone with a
    fresh compute-only variant (``compute_only()`` makes one)."""
    quiet = [v for v in variants if not v.background]
    return [quiet] + [[v, compute_only()] for v in variants if v.background]


def measure_all(variants, compute_only, args, comm, log):
    """Every phase of ``variants`` measured, then (with several ranks) the
    compute-only variant ``variants[1]`` on rank 0 alone. Returns every
    rank's rates (on rank 0; None elsewhere), the rank-0-alone samples and
    the weight spreads."""
    mine, spreads = [], {}
    for phase in phases(variants, compute_only):
        rates, spread = measure(phase, args, comm, log)
        mine.append(rates)
        spreads.update(spread)
    alone = None
    if comm.Get_size() > 1:
        log("Timing compute-only on rank 0 alone (the other ranks sleep)...")
        alone = time_alone(variants[1], args, comm)
    return comm.gather(mine, root=0), alone, spreads


def time_alone(variant, args, comm):
    """Rank 0 times ``variant`` while the other ranks sleep; the samples on
    rank 0, None elsewhere."""
    sleeping_barrier(comm)
    samples = None
    if comm.Get_rank() == 0:
        samples = [samples_per_second(variant, args.num_batches_per_iter, args.batch_size)
                   for _ in range(args.num_iters)]
    sleeping_barrier(comm)
    return samples


def _totals(everyone, phase, name):
    """Per-iteration samples/sec summed over ranks, and each rank's median."""
    per_rank = np.asarray([rank_phases[phase][name] for rank_phases in everyone])
    return per_rank.sum(axis=0), [float(np.median(r)) for r in per_rank]


def report(results, everyone, alone, spreads, pairs, unit="img/sec"):
    """Fills ``results`` (variants, ratios, alone, parameter spread) from
    every rank's rates and prints them. ``pairs`` are the (a, b) ratios to
    give when both were measured; each background phase's own compute-only
    ratio is added."""
    size = results["ranks"]
    print(f"Total {unit} on {size} rank(s), median [min-max] over {results['num_iters']} "
          f"iterations, and Horovod's mean +-1.96 sd:")
    results.setdefault("variants", {})
    results.setdefault("ratios", {})
    series = {}
    for phase, names in enumerate(everyone[0]):
        background = list(names)[0]
        for name in names:
            total, per_rank = _totals(everyone, phase, name)
            key = name if phase == 0 or name != "compute_only" else f"{name}@{background}"
            series[key] = total
            stats = summary(total)
            stats["per_rank_median"] = per_rank
            stats["per_iteration"] = [float(v) for v in total]
            results["variants"][key] = stats
            print(f"  {key:<22} {stats['median']:8.1f} [{stats['min']:.1f}-{stats['max']:.1f}]"
                  f"   {stats['mean']:.1f} +-{stats['conf']:.1f}   (ranks: "
                  + ", ".join(f"{r:.1f}" for r in per_rank) + ")")
    pairs = list(pairs) + [(key.split("@")[1], key) for key in series if "@" in key]
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
        print(f"One rank alone, compute-only (the others asleep): {stats['median']:.1f} {unit}; "
              f"hora's scaling efficiency against {size} x that: "
              f"{results['scaling_vs_alone'] * 100:.1f}% (also charges for the ranks sharing "
              f"the host's cores and memory)")
    results["parameter_spread"] = spreads
    for name, spread in spreads.items():
        print(f"Largest parameter difference between ranks after training, {name}: {spread:.3g}")
    return results


def plot(results, path, title, baseline, unit="images/sec"):
    """A bar per variant (median, min-max); the title gains hora / ``baseline``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results["variants"])
    stats = [results["variants"][n] for n in names]
    medians = [s["median"] for s in stats]
    errors = [[m - s["min"] for m, s in zip(medians, stats)],
              [s["max"] - m for m, s in zip(medians, stats)]]
    fig, ax = plt.subplots(figsize=(7, 4))
    # "compute_only@horovod" on two lines, so that neighbouring labels do
    # not run into each other
    ax.bar([n.replace("@", "\n@") for n in names], medians, yerr=errors, capsize=4,
           color=[COLORS.get(n.split("@")[0], "tab:gray") for n in names])
    for x, m in enumerate(medians):
        ax.annotate(f"{m:.0f}", (x, m), ha="center", va="bottom", xytext=(8, 2),
                    textcoords="offset points")
    ratio = results["ratios"].get(f"hora/{baseline}")
    if ratio:
        title += (f"\nhora / {baseline} {ratio['median']:.2f} "
                  f"[{ratio['min']:.2f}-{ratio['max']:.2f}]")
    ax.set_title(title)
    ax.set_ylabel(f"{unit}, all ranks (median, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(results, args, title, baseline, unit="images/sec"):
    """The results to --json and their plot to --plot, where given."""
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot, title, baseline, unit)
