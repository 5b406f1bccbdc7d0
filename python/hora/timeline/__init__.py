"""Reading hora's timeline files: ``python -m hora.timeline summarize FILE``.

The engine writes the file (``HORA_TIMELINE=path`` or
``hora.start_timeline(path)``); this package loads it, including a file cut
short by a killed job, and turns it into per-tensor and per-phase totals, the
ranks that were slowest to become ready, fusion statistics, and a per-step
plot.
"""
from hora.timeline.summary import (
    PHASES, Summary, load_events, phase_of, steps, summarize)

__all__ = ["PHASES", "Summary", "load_events", "phase_of", "steps", "summarize"]
