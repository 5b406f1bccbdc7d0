"""python -m hora.bench multihost: allreduce across hosts over a link of a fixed rate.

Builds pretend hosts on this machine (network namespaces on a bridge, as
the multi-host tests do; see hora.bench.netns_hosts), limits every host's
link to --rate in each direction with a token bucket, measures what TCP
itself gets through those links when every host sends to the next at once,
and then runs ``python -m hora.bench allreduce`` across the hosts under
horarun: hora against MPI's own allreduce over the same links (Open MPI's
TCP transport for both; hora's ring uses its point-to-point calls). The
report gives each size's bus bandwidth as a share of the link rate and of
TCP's goodput, and hora / MPI. With ``--transport tcp`` hora runs over its
own TCP transport instead (no MPI in the job; compare with gloo).

Needs root (namespaces, tc) and Open MPI; runs without a launcher:
    sudo python -m hora.bench multihost --rate 1gbit [--hosts 2] [--json out.json]

Where the pretend hosts together have more ranks than the machine has
cores, every rank is told so (HORA_SPIN_US=0, MPI's yield_when_idle): each
namespace believes it has all the cores, and ranks spinning for a core they
share with another host would measure the machine instead of the link.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from hora.bench import netns_hosts


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hora.bench multihost",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2, help="pretend hosts (2-8)")
    parser.add_argument("--ranks-per-host", type=int, default=1, help="ranks on each host")
    parser.add_argument("--rate", default="1gbit",
                        help="each host's link rate in each direction (tc units: 500mbit, "
                             "1gbit, 2.5gbit)")
    parser.add_argument("--queue-ms", type=float, default=10.0,
                        help="how much traffic a link queues before dropping, in ms at the "
                             "link rate (a switch port's buffer)")
    parser.add_argument("--min-bytes", type=int, default=1 << 20,
                        help="smallest allreduce, bytes per rank")
    parser.add_argument("--max-bytes", type=int, default=64 << 20,
                        help="largest allreduce, bytes per rank")
    parser.add_argument("--compare", default="mpi",
                        help="alternatives run beside hora ('' for none), as for allreduce")
    parser.add_argument("--transport", choices=("mpi", "tcp"), default="mpi",
                        help="hora's transport across the hosts: MPI's (Open MPI's TCP "
                             "transport), or hora's own (horarun --transport tcp; no MPI in the "
                             "job, so 'mpi' cannot be compared)")
    parser.add_argument("--timing", choices=("loop", "barrier"), default="loop",
                        help="'loop': calls back to back, as in training; 'barrier': every call "
                             "from a barrier (see allreduce --help)")
    parser.add_argument("--mpi-args", default="",
                        help="more arguments for mpirun (e.g. \"--mca coll_tuned_use_dynamic_rules "
                             "1 --mca coll_tuned_allreduce_algorithm 4\" to pick MPI's algorithm)")
    parser.add_argument("--probe-seconds", type=float, default=2.0,
                        help="how long TCP's own goodput over the links is measured")
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--plot", help="draw busbw against size, with the link rate, to this PNG")
    return parser


def parse(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 2 <= args.hosts <= len(netns_hosts.HOST_NAMES):
        parser.error(f"--hosts: between 2 and {len(netns_hosts.HOST_NAMES)}, got {args.hosts}")
    if args.ranks_per_host < 1:
        parser.error("--ranks-per-host must be at least 1")
    if args.queue_ms <= 0 or args.probe_seconds <= 0:
        parser.error("--queue-ms and --probe-seconds must be positive")
    if args.transport == "tcp" and "mpi" in args.compare.split(","):
        parser.error("--transport tcp runs no MPI: compare with gloo ('--compare gloo') or "
                     "nothing ('--compare \'\'')")
    if not 0 < args.min_bytes <= args.max_bytes:
        parser.error("--min-bytes must be positive and at most --max-bytes")
    try:
        args.rate_bits = netns_hosts.parse_rate(args.rate)
    except ValueError as error:
        parser.error(f"--rate: {error}")
    return args


def _job_command(hosts, args, results_path, oversubscribed):
    host_arg = ",".join(f"{host}:{args.ranks_per_host}" for host in hosts.hosts)
    ranks = args.hosts * args.ranks_per_host
    transport = ([] if args.transport == "mpi" else
                 ["--transport", "tcp", "--remote-shell", str(hosts.agent),
                  "--supervisor-address", f"{hosts.subnet}.254"])
    return [sys.executable, "-m", "hora.runner", "-np", str(ranks), "-H", host_arg, *transport,
            # no binding: each namespace would bind its first rank to core 0
            "--binding-args", "--bind-to none",
            "--mpi-args", " ".join(filter(None, [hosts.mpi_args(yield_when_idle=oversubscribed),
                                                 args.mpi_args])),
            *hosts.GLOO_EXPORTS,  # for --compare gloo
            sys.executable, "-m", "hora.bench", "allreduce", "--compare", args.compare,
            "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes),
            "--timing", args.timing, "--json", results_path]


def summarize(rows, link_bytes, goodput):
    """One entry per size: each implementation's busbw, as a share of the
    link rate and of TCP's goodput, and hora / each other."""
    table = {}
    for row in rows:
        entry = table.setdefault(row["size"], {"size": row["size"], "impls": {}})
        entry["impls"][row["impl"]] = {
            "time_us": row["time_us"], "busbw": row["busbw"], "wrong": row["wrong"],
            "of_link": row["busbw"] * 1e9 / link_bytes,
            "of_tcp": row["busbw"] * 1e9 / goodput if goodput else None}
    for entry in table.values():
        hora = entry["impls"].get("hora")
        entry["hora_over"] = {name: hora["busbw"] / other["busbw"]
                              for name, other in entry["impls"].items()
                              if hora and name != "hora" and other["busbw"] > 0}
    return [table[size] for size in sorted(table)]


def report(summary, args, link_bytes, goodput):
    print(f"# allreduce across {args.hosts} hosts x {args.ranks_per_host} rank(s), links of "
          f"{args.rate} ({link_bytes / 1e9:.4f} GB/s) each way, queue {args.queue_ms:g} ms, "
          f"{'calls back to back' if args.timing == 'loop' else 'each call from a barrier'}")
    if goodput:
        print(f"# TCP goodput, every host sending to the next at once: {goodput / 1e9:.4f} GB/s "
              f"({goodput / link_bytes * 100:.1f}% of the link rate)")
    names = sorted({name for entry in summary for name in entry["impls"]},
                   key=lambda name: (name != "hora", name))
    header = f"# {'size':>11}"
    for name in names:
        header += f" {name + ' busbw':>14} {'of link':>8}"
    header += "".join(f" {'hora/' + name:>10}" for name in names if name != "hora")
    print(header)
    for entry in summary:
        line = f"  {entry['size']:>11}"
        for name in names:
            impl = entry["impls"].get(name)
            line += (f" {impl['busbw']:>14.4f} {impl['of_link'] * 100:>7.1f}%" if impl
                     else f" {'-':>14} {'-':>8}")
        line += "".join(f" {entry['hora_over'].get(name, float('nan')):>10.2f}"
                        for name in names if name != "hora")
        print(line)
    wrong = sum(impl["wrong"] for entry in summary for impl in entry["impls"].values())
    if wrong:
        print(f"# WRONG RESULTS: {wrong} elements differed from the expected sum")


def plot(summary, args, link_bytes, goodput, path):
    from hora.bench.plotting import busbw_plot
    series = {}
    for entry in summary:
        for name, impl in entry["impls"].items():
            series.setdefault(name, []).append((entry["size"], impl["busbw"]))
    lines = [(link_bytes / 1e9, f"link rate ({args.rate})", "--", "black")]
    if goodput:
        lines.append((goodput / 1e9, "TCP goodput", ":", "gray"))
    busbw_plot(series, f"allreduce, {args.hosts} hosts x {args.ranks_per_host} rank(s), "
                       f"{args.rate} links", path, lines)


def run(args):
    reason = netns_hosts.why_not(need_tc=True)
    if reason:
        raise SystemExit(f"multihost: {reason}")
    link_bytes = args.rate_bits / 8
    ranks = args.hosts * args.ranks_per_host
    oversubscribed = ranks > len(os.sched_getaffinity(0))
    tag = str(os.getpid() % 100000)
    with tempfile.TemporaryDirectory(prefix="hora-bench-multihost-") as folder:
        hosts = netns_hosts.NetnsHosts(tag, f"10.233.{os.getpid() % 250}", folder, args.hosts)
        try:
            hosts.create()
        except netns_hosts.NetnsError as error:
            raise SystemExit(f"multihost: {error}") from None
        try:
            hosts.shape(args.rate, args.queue_ms)
            goodput = hosts.ring_goodput(args.probe_seconds)
            results_path = os.path.join(folder, "allreduce.json")
            env = hosts.job_env()
            if oversubscribed:
                env["HORA_SPIN_US"] = "0"
            print(f"# {ranks} rank(s) on {args.hosts} pretend hosts sharing this machine's "
                  f"{len(os.sched_getaffinity(0))} core(s)"
                  + ("; told not to spin" if oversubscribed else ""), flush=True)
            job = subprocess.run(_job_command(hosts, args, results_path, oversubscribed),
                                 env=env, timeout=3600, check=False)
            if job.returncode != 0:
                raise SystemExit(f"multihost: the allreduce job failed (exit {job.returncode})")
            with open(results_path) as f:
                rows = json.load(f)["rows"]
        finally:
            hosts.destroy()
    summary = summarize(rows, link_bytes, goodput)
    report(summary, args, link_bytes, goodput)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "multihost", "hosts": args.hosts,
                       "ranks_per_host": args.ranks_per_host, "rate": args.rate,
                       "link_bytes_per_second": link_bytes, "queue_ms": args.queue_ms,
                       "timing": args.timing,
                       "tcp_goodput_bytes_per_second": goodput,
                       "oversubscribed": oversubscribed, "sizes": summary}, f, indent=1)
    if args.plot:
        plot(summary, args, link_bytes, goodput, args.plot)
    return 0


def main(argv=None):
    return run(parse(argv))
