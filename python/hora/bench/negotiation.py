"""python -m hora.bench negotiation: what negotiating a training step costs
at 8 to 1024 ranks, measured in one process, and what a step would cost at
scale according to a simple model.

Each rank is a thread of this process, connected to the others by the
in-process transport (hora's C++ test tier uses the same one). Every rank
runs the real negotiation: its controller, its response cache and, on rank
0, the coordinator. Each negotiated collective is then planned as the
executor would plan it. No tensor bytes move. A step submits
``--tensors`` allreduces (161, the ResNet-50 gradient count) and runs
cycles until all of them are decided. The first step goes through the
coordinator, and every later step is answered from the response cache. The
report gives, per step, the CPU time of rank 0 and of the last rank (their
threads' own clocks) and the wall time.

In-process, the response cache's bit-vector allreduce is a gather to rank 0
and a broadcast from it, so the coordinator's CPU grows linearly with the
number of ranks. MPI runs the same allreduce as a tree of about log2(ranks)
steps. The cost model therefore takes from the measurement only the
per-rank CPU of a cached cycle, which does not depend on the transport, and
adds the network's latency itself.

The model, for a step of ``--gradient-mib`` of gradients and
``--compute-ms`` of computation on every rank, over links of ``--link-gbps``
with a small-message latency of ``--latency-us``:

* a cycle costs the measured per-rank CPU, plus 2 * ceil(log2(ranks)) *
  latency for the cache's allreduce;
* the ring allreduce costs 2 * (n - 1) / n * bytes / bandwidth, plus
  2 * (n - 1) * latency per fused buffer (``--fusion-mib``). With
  ``--ranks-per-host`` > 1 the ring runs over the hosts (n = ranks / ranks
  per host) and the host's ranks share its link, as in a hierarchical
  allreduce;
* the efficiency is computed twice: once with nothing overlapped (compute /
  (compute + communication)), and once with communication hidden behind
  the backward pass (two thirds of the compute) as far as that allows.
"""

import argparse
import json
import math
import statistics

from hora._loader import _C


def build_parser():
    """The command line of ``python -m hora.bench negotiation``."""
    parser = argparse.ArgumentParser(prog="python -m hora.bench negotiation",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--ranks", default="8,16,64,256,1024",
                        help="comma-separated numbers of simulated ranks")
    parser.add_argument("--tensors", type=int, default=161,
                        help="allreduces per step (161: ResNet-50's gradients)")
    parser.add_argument("--steps", type=int, default=8,
                        help="steps per simulation (the first one uncached)")
    parser.add_argument("--model-ranks", default="64,256,1024",
                        help="rank counts the cost model predicts a step for")
    parser.add_argument("--gradient-mib", type=float, default=170.0,
                        help="model: gradient bytes per step (170 MiB: ResNet-101, float32)")
    parser.add_argument("--compute-ms", type=float, default=250.0,
                        help="model: forward and backward time per step on each rank")
    parser.add_argument("--link-gbps", type=float, default=100.0,
                        help="model: each host's network bandwidth, Gbit/s")
    parser.add_argument("--latency-us", type=float, default=5.0,
                        help="model: small-message latency between hosts, microseconds")
    parser.add_argument("--ranks-per-host", type=int, default=8,
                        help="model: ranks sharing a host and its link (1: a flat ring)")
    parser.add_argument("--fusion-mib", type=float, default=128.0,
                        help="model: fusion buffer size (each buffer pays the ring's latency)")
    parser.add_argument("--cycles-per-step", type=int, default=4,
                        help="model: negotiation cycles per step (about one per gradient "
                             "bucket)")
    parser.add_argument("--json", help="write the measurements and the model to this file")
    return parser


def parse(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.ranks = [int(n) for n in args.ranks.split(",") if n.strip()]
        args.model_ranks = [int(n) for n in args.model_ranks.split(",") if n.strip()]
    except ValueError:
        parser.error("--ranks and --model-ranks take comma-separated integers")
    if not args.ranks or min(args.ranks) < 2 or max(args.ranks) > 4096:
        parser.error("--ranks: each between 2 and 4096")
    if args.tensors < 1 or args.steps < 2:
        parser.error("--tensors must be at least 1 and --steps at least 2")
    if args.ranks_per_host < 1:
        parser.error("--ranks-per-host must be at least 1")
    return args


def measure(ranks, tensors, steps):
    raw = _C.simulate_negotiation(ranks, tensors, steps)
    cached = slice(1, None)
    return {
        "ranks": ranks,
        "first_step_coordinator_cpu_s": raw["coordinator_cpu"][0],
        "first_step_wall_s": raw["coordinator_wall"][0],
        "cached_coordinator_cpu_s": statistics.median(raw["coordinator_cpu"][cached]),
        "cached_other_rank_cpu_s": statistics.median(raw["last_rank_cpu"][cached]),
        "cached_wall_s": statistics.median(raw["coordinator_wall"][cached]),
        "cycles_per_step": max(raw["coordinator_cycles"]),
    }


def predict(args, ranks, cycle_cpu_s):
    """The cost model for one step at ``ranks`` ranks (see the module doc)."""
    latency = args.latency_us * 1e-6
    bandwidth = args.link_gbps * 1e9 / 8
    nbytes = args.gradient_mib * 2**20
    hosts = max(1, ranks // args.ranks_per_host)
    ring_n = hosts if args.ranks_per_host > 1 else ranks
    buffers = max(1, math.ceil(args.gradient_mib / args.fusion_mib))
    cycle = cycle_cpu_s + 2 * math.ceil(math.log2(max(ranks, 2))) * latency
    negotiation = args.cycles_per_step * cycle
    ring_bw = 2 * (ring_n - 1) / ring_n * nbytes / bandwidth if ring_n > 1 else 0.0
    ring_latency = 2 * (ring_n - 1) * latency * buffers
    communication = negotiation + ring_bw + ring_latency
    compute = args.compute_ms * 1e-3
    exposed = max(0.0, communication - compute * 2 / 3)
    return {"ranks": ranks, "cycle_s": cycle, "negotiation_s": negotiation,
            "ring_bandwidth_s": ring_bw, "ring_latency_s": ring_latency,
            "communication_s": communication,
            "efficiency_no_overlap": compute / (compute + communication),
            "efficiency_overlapped": compute / (compute + exposed)}


def main(argv=None):
    args = parse(argv)
    print(f"# negotiation of {args.tensors} allreduces per step, ranks as threads of one "
          f"process (in-process transport), {args.steps} steps each")
    print(f"{'ranks':>6} {'1st step: rank 0 CPU':>21} {'wall':>9} {'cached: rank 0 CPU':>19} "
          f"{'other rank CPU':>15} {'wall':>9} {'cycles':>7}")
    rows = []
    for ranks in args.ranks:
        row = measure(ranks, args.tensors, args.steps)
        rows.append(row)
        print(f"{ranks:>6} {row['first_step_coordinator_cpu_s'] * 1e3:>18.2f} ms "
              f"{row['first_step_wall_s'] * 1e3:>6.1f} ms "
              f"{row['cached_coordinator_cpu_s'] * 1e6:>16.0f} us "
              f"{row['cached_other_rank_cpu_s'] * 1e6:>12.0f} us "
              f"{row['cached_wall_s'] * 1e3:>6.2f} ms {row['cycles_per_step']:>7}", flush=True)
    cycle_cpu = statistics.median(r["cached_other_rank_cpu_s"] for r in rows)
    print(f"\n# cost model: {args.gradient_mib:g} MiB of gradients, {args.compute_ms:g} ms of "
          f"compute per step, {args.link_gbps:g} Gb/s links, {args.latency_us:g} us latency, "
          f"{args.ranks_per_host} rank(s) per host, {args.cycles_per_step} cycles per step of "
          f"{cycle_cpu * 1e6:.0f} us CPU (the measured cached cycle of a non-coordinator rank)")
    print(f"{'ranks':>6} {'cycle':>9} {'ring, bandwidth':>16} {'ring, latency':>14} "
          f"{'comm total':>11} {'eff. no overlap':>16} {'eff. overlapped':>16}")
    model = []
    for ranks in args.model_ranks:
        p = predict(args, ranks, cycle_cpu)
        model.append(p)
        print(f"{ranks:>6} {p['cycle_s'] * 1e6:>6.0f} us {p['ring_bandwidth_s'] * 1e3:>13.1f} ms "
              f"{p['ring_latency_s'] * 1e3:>11.2f} ms {p['communication_s'] * 1e3:>8.1f} ms "
              f"{p['efficiency_no_overlap'] * 100:>15.1f}% "
              f"{p['efficiency_overlapped'] * 100:>15.1f}%")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "negotiation", "tensors": args.tensors, "steps": args.steps,
                       "measured": rows, "model_parameters": {
                           k: getattr(args, k) for k in (
                               "gradient_mib", "compute_ms", "link_gbps", "latency_us",
                               "ranks_per_host", "fusion_mib", "cycles_per_step")},
                       "model": model}, f, indent=1)
    return 0
