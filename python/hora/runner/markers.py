"""Status lines that each rank's wrapper prints for horarun.

They travel with the ranks' own output through mpirun's I/O forwarding, so
they reach horarun from every host without a network channel of their own.
horarun takes them out of the stream; users never see them.

A marker is one line: a record-separator byte, ``hora-runner``, the event
(``started``, ``raised`` or ``exited``), the rank, the host, for a
``started`` process that an in-place elastic world started whether it is
``new`` (a new slot's) or a ``replacement``, for ``exited`` the outcome
(``code=N`` or ``signal=NAME``), and for ``raised`` and ``exited`` the
time (seconds since the epoch): the order in which markers reach horarun
from several hosts is not the order in which ranks failed.
``raised`` says when the rank's program met an exception it did not catch
(hora reports it; see ``hora.common.failure_report``), and whether the
error was its own or came from a peer (``own`` or ``peer``, in the outcome
field; ``peer=N`` when the error names the rank N that caused it): a rank
whose peers fail because it stopped exits later than they may, but raised
first.
"""
import dataclasses
import signal

_LEAD = b"\x1ehora-runner "


def signal_name(signum):
    """'SIGKILL' (or 'SIG99' for a number Python has no name for)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


@dataclasses.dataclass(frozen=True)
class Marker:
    event: str
    rank: int
    host: str
    # "code=N" or "signal=NAME" for "exited", "own"/"peer"/"peer=N" for
    # "raised"; for "started", "new" or "replacement" for a process an
    # in-place elastic world started (a new slot's, a lost rank's), else ""
    outcome: str = ""
    time: float = 0.0  # when it exited ("exited") or raised ("raised")

    def describe(self):
        """'exit code 3', 'killed by SIGKILL', or, for a rank whose end was
        never reported, 'named by rank 2 as lost or stopped'."""
        kind, _, value = self.outcome.partition("=")
        if kind == "named":
            return f"named by rank {value} as lost or stopped"
        return f"killed by {value}" if kind == "signal" else f"exit code {value}"

    def exit_code(self):
        """What a launcher exits with for this rank's end: its exit code,
        128 + the signal that killed it, or 0 when that is unknown."""
        kind, _, value = self.outcome.partition("=")
        if kind == "code":
            return int(value)
        if kind == "signal" and value in signal.Signals.__members__:
            return 128 + signal.Signals[value].value
        return 0

    @property
    def failed(self):
        return self.event == "exited" and self.outcome != "code=0"


def encode(marker):
    fields = [marker.event, str(marker.rank), marker.host]
    if marker.event == "started" and marker.outcome:
        fields.append(marker.outcome)  # new / replacement: started in place
    elif marker.event == "exited":
        fields += [marker.outcome, f"{marker.time:.6f}"]
    elif marker.event == "raised":
        fields += [f"{marker.time:.6f}", marker.outcome or "own"]
    return _LEAD + " ".join(fields).encode() + b"\n"


def decode(line):
    """The Marker in ``line`` (bytes, with or without its newline), or None
    for an ordinary output line."""
    if not line.startswith(_LEAD):
        return None
    fields = line[len(_LEAD):].decode(errors="replace").split()
    try:
        if fields[0] == "started" and len(fields) in (3, 4):
            return Marker("started", int(fields[1]), fields[2], *fields[3:])
        if fields[0] == "exited" and len(fields) == 5:
            return Marker("exited", int(fields[1]), fields[2], fields[3], float(fields[4]))
        if fields[0] == "raised" and len(fields) == 5:
            return Marker("raised", int(fields[1]), fields[2], fields[4], float(fields[3]))
    except (IndexError, ValueError):
        pass
    return None
