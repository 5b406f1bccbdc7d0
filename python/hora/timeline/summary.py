"""Loads a timeline and computes what ``summarize`` prints."""
import collections
import dataclasses
import json

# What each activity in the file counts as.
PHASES = ("negotiate", "wait", "copy", "communicate")
_CONTAINERS = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER"}


def phase_of(activity):
    """'negotiate', 'wait', 'copy', 'communicate', or None (the per-collective
    span that contains the others)."""
    if activity.startswith("NEGOTIATE_"):
        return "negotiate"
    if activity == "QUEUE":
        return "wait"
    if activity.startswith("MEMCPY_"):
        return "copy"
    if activity in _CONTAINERS:
        return None
    return "communicate"


def load_events(path):
    """The events of a timeline file, also when the job was killed before
    the file was finished (no closing bracket, or half a line at the end)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if not text.lstrip().startswith("["):
        raise ValueError(f"{path} is not a hora timeline (not a JSON array of trace events)")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    body = text.rstrip().rstrip(",")
    for attempt in range(2):
        try:
            return json.loads(body + "\n]")
        except json.JSONDecodeError:
            if attempt == 0:
                # The writer was cut off mid-event: drop the partial line.
                body = body[:body.rfind("\n")].rstrip().rstrip(",") if "\n" in body else "["
    raise ValueError(f"{path} is not a hora timeline (not a JSON array of trace events)")


@dataclasses.dataclass
class Interval:
    tensor: str
    activity: str
    start: float  # microseconds
    end: float
    args: dict


@dataclasses.dataclass
class Summary:
    tensors: dict            # name -> {"runs": n, phase: microseconds, ...}
    phase_totals: dict       # phase -> microseconds (union over tensors)
    rank_lag: dict           # rank -> {"mean_us": x, "last": count, "seen": count}
    fusion: dict             # batches, tensors, mean/max tensors and bytes per batch
    dropped: bool
    span_us: float


def intervals(events):
    """Every span in the file, paired up (B/E) or as written (X)."""
    rows = {e["pid"]: e["args"]["name"] for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    open_spans = collections.defaultdict(list)
    spans, instants = [], []
    for e in events:
        phase, row = e.get("ph"), rows.get(e.get("pid"), str(e.get("pid")))
        if phase == "X":
            spans.append(Interval(row, e["name"], e["ts"], e["ts"] + e.get("dur", 0),
                                  e.get("args", {})))
        elif phase == "B":
            open_spans[(row, e["name"])].append(e)
        elif phase == "E" and open_spans[(row, e["name"])]:
            begin = open_spans[(row, e["name"])].pop()
            spans.append(Interval(row, e["name"], begin["ts"], e["ts"], begin.get("args", {})))
        elif phase == "i":
            instants.append((row, e["name"], e["ts"], e.get("args", {})))
    return spans, instants


def _union(pieces):
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(pieces):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def _rank_lag(spans, instants):
    """How long after the first rank each rank became ready, per negotiation."""
    negotiations = [s for s in spans if phase_of(s.activity) == "negotiate"]
    by_tensor = collections.defaultdict(list)
    for tensor, name, ts, args in instants:
        if name.endswith(" ready") and "rank" in args:
            by_tensor[tensor].append((ts, args["rank"]))
    lag = collections.defaultdict(lambda: {"total_us": 0.0, "last": 0, "seen": 0})
    for n in negotiations:
        ready = sorted((ts, rank) for ts, rank in by_tensor[n.tensor] if n.start <= ts <= n.end)
        ranks = {}
        for ts, rank in ready:
            ranks.setdefault(rank, ts)
        if len(ranks) < 2:
            continue  # answered from the cache: only rank 0's readiness is known
        first = min(ranks.values())
        last_rank = max(ranks, key=ranks.get)
        for rank, ts in ranks.items():
            lag[rank]["total_us"] += ts - first
            lag[rank]["seen"] += 1
        lag[last_rank]["last"] += 1
    return {rank: {"mean_us": v["total_us"] / v["seen"], "last": v["last"], "seen": v["seen"]}
            for rank, v in sorted(lag.items())}


def _fusion(spans):
    batches = {}
    for s in spans:
        if s.activity == "ALLREDUCE" and "tensors" in s.args:
            batches[(s.args.get("first"), s.start)] = s.args
    sizes = [b["tensors"] for b in batches.values()]
    bytes_ = [b.get("bytes", 0) for b in batches.values()]
    if not sizes:
        return {"batches": 0}
    return {"batches": len(sizes), "tensors": sum(sizes), "mean_tensors": sum(sizes) / len(sizes),
            "max_tensors": max(sizes), "mean_bytes": sum(bytes_) / len(bytes_),
            "max_bytes": max(bytes_), "fused_batches": sum(1 for n in sizes if n > 1)}


def summarize(events):
    spans, instants = intervals(events)
    tensors = collections.defaultdict(lambda: dict({"runs": 0}, **{p: 0.0 for p in PHASES}))
    by_phase = collections.defaultdict(list)
    for s in spans:
        phase = phase_of(s.activity)
        if phase is None:
            tensors[s.tensor]["runs"] += 1
            continue
        tensors[s.tensor][phase] += s.end - s.start
        by_phase[phase].append((s.start, s.end))
    times = [t for s in spans for t in (s.start, s.end)]
    return Summary(
        tensors=dict(tensors),
        phase_totals={p: _union(by_phase[p]) for p in PHASES},
        rank_lag=_rank_lag(spans, instants),
        fusion=_fusion(spans),
        dropped=any(name == "events dropped" for _, name, _, _ in instants)
        or any(e.get("name") == "events dropped" for e in events),
        span_us=(max(times) - min(times)) if times else 0.0)


def steps(events, gap_us=5000.0):
    """Splits the job into steps and returns, per step, its start and the
    wall time of each phase in it. A step ends where a tensor it already
    ran comes again (a training step runs each gradient once), or at an
    idle gap longer than ``gap_us`` (the framework's compute between bursts
    of collectives), whichever comes first: a small model's compute may
    take less than the gap."""
    spans, _ = intervals(events)
    spans.sort(key=lambda s: s.start)
    groups, current, current_end = [], [], None
    ran = {}  # tensor -> end of its collective in the current step
    for s in spans:
        # A run starts with its negotiation (or its queueing, when the
        # response cache decided it).
        again = (s.tensor in ran and s.start >= ran[s.tensor]
                 and phase_of(s.activity) in ("negotiate", "wait"))
        if current and (again or s.start - current_end > gap_us):
            groups.append(current)
            current, current_end, ran = [], None, {}
        if s.activity in _CONTAINERS:
            ran[s.tensor] = s.end
            continue
        current.append(s)
        current_end = s.end if current_end is None else max(current_end, s.end)
    if current:
        groups.append(current)
    out = []
    for group in groups:
        row = {"start_us": group[0].start}
        for phase in PHASES:
            row[phase] = _union([(s.start, s.end) for s in group if phase_of(s.activity) == phase])
        out.append(row)
    return out
