"""python -m hora.bench compression: training over slow links, with and without compression.

Builds pretend hosts on this machine (network namespaces on a bridge; see
hora.bench.netns_hosts), limits every host's link to each --rates value in
each direction, and trains each --models model across them with one rank
per host under horarun: ``python -m hora.bench torch-synthetic`` with hora
uncompressed (float32) against the --methods variants in one job, the
variants alternating in blocks. Each variant's bytes per batch are counted
on the host's link (``--count-bytes eth0``), not estimated. The report
gives images/sec, the speed-up over float32 hora, and the bytes each host
sent per batch.

Needs root (namespaces, tc) and Open MPI; runs without a launcher:
    sudo python -m hora.bench compression --rates 1gbit,100mbit --models resnet18,transformer
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from hora.bench import netns_hosts, train_variants

DEFAULT_METHODS = ("hora_fp16,hora_powersgd1,hora_powersgd2,hora_powersgd4,ddp,ddp_powersgd1,"
                   "ddp_powersgd2,ddp_powersgd4")
BATCH_SIZES = {"resnet20": 32, "resnet18": 8, "transformer": 2}


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hora.bench compression",
                                     description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--hosts", type=int, default=2, help="pretend hosts, one rank each")
    parser.add_argument("--rates", default="1gbit,100mbit",
                        help="comma-separated link rates, each host's in each direction "
                             "(tc units: 100mbit, 1gbit)")
    parser.add_argument("--models", default="resnet18,transformer",
                        help="comma-separated torch-synthetic models")
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help="comma-separated variants trained beside float32 hora (see "
                             "torch-synthetic --compare)")
    parser.add_argument("--queue-ms", type=float, default=10.0,
                        help="how much traffic a link queues before dropping, in ms at the rate")
    parser.add_argument("--num-warmup-batches", type=int, default=3,
                        help="batches per variant before timing (PowerSGD starts after 2)")
    parser.add_argument("--num-batches-per-iter", type=int, default=2,
                        help="batches timed as one measurement")
    parser.add_argument("--num-iters", type=int, default=3, help="measurements per variant")
    parser.add_argument("--json", help="write the results to this file")
    return parser


def parse(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 2 <= args.hosts <= len(netns_hosts.HOST_NAMES):
        parser.error(f"--hosts: between 2 and {len(netns_hosts.HOST_NAMES)}, got {args.hosts}")
    args.rate_list = [r.strip() for r in args.rates.split(",") if r.strip()]
    for rate in args.rate_list:
        try:
            netns_hosts.parse_rate(rate)
        except ValueError as error:
            parser.error(f"--rates: {error}")
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.model_list if m not in BATCH_SIZES]
    if unknown or not args.model_list:
        parser.error(f"--models: choose from {', '.join(BATCH_SIZES)}, got {args.models!r}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in train_variants.KNOWN]
    if unknown:
        parser.error(f"--methods: unknown {', '.join(unknown)}; choose from "
                     f"{', '.join(train_variants.KNOWN)}")
    args.method_list = methods
    for option in ("num_batches_per_iter", "num_iters"):
        if getattr(args, option) < 1:
            parser.error(f"--{option.replace('_', '-')} must be at least 1")
    if args.num_warmup_batches < train_variants.COMPRESSION_START:
        parser.error(f"--num-warmup-batches must be at least {train_variants.COMPRESSION_START} "
                     f"(the uncompressed steps before compression starts)")
    return args


def _job(hosts, args, model, results_path):
    host_arg = ",".join(f"{host}:1" for host in hosts.hosts)
    return [sys.executable, "-m", "hora.runner", "-np", str(args.hosts), "-H", host_arg,
            "--binding-args", "--bind-to none",
            "--mpi-args", hosts.mpi_args(yield_when_idle=args.hosts > len(os.sched_getaffinity(0))),
            *hosts.GLOO_EXPORTS,  # for DDP
            sys.executable, "-m", "hora.bench", "torch-synthetic", "--model", model,
            "--batch-size", str(BATCH_SIZES[model]), "--threads", "1",
            "--compare", ",".join(args.method_list), "--count-bytes", "eth0",
            "--num-warmup-batches", str(args.num_warmup_batches),
            "--num-batches-per-iter", str(args.num_batches_per_iter),
            "--num-iters", str(args.num_iters), "--json", results_path]


def summarize(results):
    """Per variant: images/sec (median), its ratio to float32 hora, and the
    bytes each host sent per batch (the largest over the hosts)."""
    variants = results["variants"]
    base = variants["hora"]["median"]
    sent = results.get("sent_bytes_per_batch", {})
    return {name: {"images_per_second": stats["median"], "min": stats["min"],
                   "max": stats["max"], "vs_hora_fp32": stats["median"] / base,
                   "sent_bytes_per_batch": max(sent.get(name, [0.0]))}
            for name, stats in variants.items()}


def report(model, rate, rows):
    print(f"\n{model} at {rate} per link:")
    print(f"  {'variant':<18} {'images/sec':>11} {'x fp32 hora':>12} {'MiB sent/batch':>15}")
    for name, row in rows.items():
        print(f"  {name:<18} {row['images_per_second']:11.2f} {row['vs_hora_fp32']:12.2f} "
              f"{row['sent_bytes_per_batch'] / 2**20:15.3f}")


def run(args):
    reason = netns_hosts.why_not(need_tc=True)
    if reason:
        raise SystemExit(f"compression: {reason}")
    tag = str(os.getpid() % 100000)
    subnet = f"10.234.{os.getpid() % 250}"
    everything = {}
    with tempfile.TemporaryDirectory(prefix="hora-bench-compression-") as folder:
        hosts = netns_hosts.NetnsHosts(tag, subnet, folder, args.hosts)
        try:
            hosts.create()
        except netns_hosts.NetnsError as error:
            raise SystemExit(f"compression: {error}") from None
        try:
            env = hosts.job_env()
            for rate in args.rate_list:
                hosts.shape(rate, args.queue_ms)
                for model in args.model_list:
                    print(f"# {model}, {args.hosts} pretend hosts at {rate} per link",
                          flush=True)
                    path = os.path.join(folder, f"{model}-{rate}.json")
                    job = subprocess.run(_job(hosts, args, model, path), env=env, timeout=7200,
                                         check=False)
                    if job.returncode != 0:
                        raise SystemExit(f"compression: the {model} job at {rate} failed "
                                         f"(exit {job.returncode})")
                    with open(path) as f:
                        rows = summarize(json.load(f))
                    everything[f"{model}@{rate}"] = rows
        finally:
            hosts.destroy()
    for key, rows in everything.items():
        model, rate = key.split("@")
        report(model, rate, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "compression", "hosts": args.hosts, "rates": args.rate_list,
                       "models": args.model_list, "methods": args.method_list,
                       "queue_ms": args.queue_ms, "results": everything}, f, indent=1)
    return 0


def main(argv=None):
    return run(parse(argv))
