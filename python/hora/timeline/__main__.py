"""``python -m hora.timeline summarize FILE [--plot OUT.png] [--top N] [--gap-ms MS]``"""
import argparse
import sys

from hora.timeline.summary import PHASES, load_events, steps, summarize


def _ms(us):
    return f"{us / 1000:10.3f}"


def render(summary, top):
    lines = [f"timeline span: {summary.span_us / 1000:.3f} ms"]
    if summary.dropped:
        lines.append("note: the writer fell behind and dropped events; totals are lower bounds")
    lines.append("")
    lines.append("phase totals (wall time, ms):")
    for phase in PHASES:
        lines.append(f"  {phase:<12}{_ms(summary.phase_totals[phase])}")
    lines.append("")
    ranked = sorted(summary.tensors.items(),
                    key=lambda item: -sum(item[1][p] for p in PHASES))
    lines.append(f"tensors by total time (top {min(top, len(ranked))} of {len(ranked)}, ms):")
    # Whole names: bucket names differ only at their ends.
    width = max([len("tensor")] + [len(name) for name, _ in ranked[:top]]) + 2
    lines.append(f"  {'tensor':<{width}}{'runs':>6}" + "".join(f"{p:>12}" for p in PHASES))
    for name, row in ranked[:top]:
        lines.append(f"  {name:<{width}}{row['runs']:>6}"
                     + "".join(_ms(row[p]) + "  " for p in PHASES))
    lines.append("")
    if summary.rank_lag:
        lines.append("ranks slowest to become ready (negotiations through the coordinator):")
        for rank, lag in sorted(summary.rank_lag.items(), key=lambda item: -item[1]["mean_us"]):
            lines.append(f"  rank {rank:<5} mean lag {lag['mean_us'] / 1000:8.3f} ms   last in "
                         f"{lag['last']} of {lag['seen']}")
    else:
        lines.append("ranks slowest to become ready: no negotiation with every rank's readiness "
                     "(all tensors came from the response cache)")
    lines.append("")
    f = summary.fusion
    if f.get("batches"):
        lines.append(f"fusion: {f['tensors']} allreduce tensors in {f['batches']} batches "
                     f"({f['fused_batches']} fused); {f['mean_tensors']:.1f} tensors and "
                     f"{f['mean_bytes'] / 2**20:.2f} MiB per batch on average, at most "
                     f"{f['max_tensors']} tensors and {f['max_bytes'] / 2**20:.2f} MiB")
    else:
        lines.append("fusion: no allreduce in the timeline")
    return "\n".join(lines)


def plot(events, out, gap_ms):
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("hora.timeline: --plot needs matplotlib "
                         "(pip install matplotlib, or hora's 'plot' extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = steps(events, gap_ms * 1000)
    fig, ax = plt.subplots(figsize=(max(6, min(20, len(rows) * 0.3)), 4))
    bottom = [0.0] * len(rows)
    xs = list(range(len(rows)))
    for phase in PHASES:
        values = [row[phase] / 1000 for row in rows]
        ax.bar(xs, values, bottom=bottom, label=phase)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel(f"step (bursts of collectives separated by more than {gap_ms:g} ms)")
    ax.set_ylabel("ms (wall time of each phase)")
    ax.set_title("hora timeline: time per step")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    return len(rows)


def build_parser():
    """The command line of ``python -m hora.timeline``."""
    parser = argparse.ArgumentParser(prog="python -m hora.timeline",
                                     description="Read a hora timeline file.")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summarize", help="per-tensor and per-phase totals, slow ranks, fusion")
    s.add_argument("file", help="the timeline JSON file (HORA_TIMELINE)")
    s.add_argument("--plot", metavar="OUT.png",
                   help="also draw the per-step breakdown (negotiate / wait / copy / communicate)")
    s.add_argument("--top", type=int, default=20, help="tensors to list (default 20)")
    s.add_argument("--gap-ms", type=float, default=5.0,
                   help="an idle gap this long starts a new step in the plot (default 5; "
                        "a tensor that runs again starts one too)")
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        events = load_events(args.file)
    except (OSError, ValueError) as exc:
        print(f"hora.timeline: {exc}", file=sys.stderr)
        return 1
    print(render(summarize(events), args.top))
    if args.plot:
        count = plot(events, args.plot, args.gap_ms)
        print(f"\nplot of {count} steps written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
