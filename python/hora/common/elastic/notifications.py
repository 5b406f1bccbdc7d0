"""Rank 0's line to horarun: a background thread that turns horarun's
"hosts changed" messages into ``state.on_hosts_updated`` calls.

The messages are text lines on a TCP connection to the address horarun
gives in ``HORA_ELASTIC_SUPERVISOR``: ``hosts-updated <timestamp>`` (the
world must be formed again), or, for a job that grows in place,
``hosts-updated <timestamp> grow <size> <place> <add>``: the world may grow
to ``<size>`` ranks, the new processes going to ``<place>``
(``host:count,...``) of which ``<add>`` (``host,...``) are hosts the job
did not start with; ``-`` for none (a job on this machine only). In place,
``hosts-updated <timestamp> lower <size> <removed>`` says that hosts
(``host,...``) whose ranks were all lost already left the job's hosts, so
the world comes back to ``<size>`` ranks at most: the ranks go on, and
start no processes for the lost ranks beyond that (``-``: no host left,
some have fewer slots). ``hosts-updated <timestamp> shrink <size>
<host>:<slots>:<reported>,...`` says that hosts of the job have fewer
slots (0: removed) while ranks still run there: at the next commit the
ranks on each such host (those whose host name is ``<reported>``, or one
of its ``|``-separated names) beyond
its slots leave the job, lowest ranks staying, and the others go on in
place, ``<size>`` ranks at most. A rank 0
of a world formed later connects again and hears every message sent so
far; ``State.check_host_updates`` acts only on those newer than the last
it saw.
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any


class HostUpdateListener:
    def __init__(self, address: str, state: Any):
        host, _, port = address.rpartition(":")
        self._address = (host, int(port))
        # registered before the connection: the messages sent so far come
        # at once
        self._states: list[Any] = [state]
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._listen, name="hora-elastic-hosts",
                                        daemon=True)
        self._thread.start()

    def register(self, state: Any) -> None:
        with self._lock:
            if state not in self._states:
                self._states.append(state)

    def _listen(self) -> None:
        try:
            with socket.create_connection(self._address, timeout=10) as connection:
                connection.settimeout(None)
                for line in connection.makefile("r", encoding="utf-8"):
                    fields = line.split()
                    if len(fields) < 2 or fields[0] != "hosts-updated":
                        continue
                    update = parse_update(fields[2:])
                    with self._lock:
                        states = list(self._states)
                    for state in states:
                        state.on_hosts_updated(float(fields[1]), update)
        except (OSError, ValueError) as error:
            print(f"hora.elastic: lost the connection to horarun at {self._address[0]}:"
                  f"{self._address[1]} ({error}); host changes will not be noticed until "
                  f"another process is rank 0", file=sys.stderr, flush=True)


def parse_update(fields: list[str]) -> dict[str, Any] | None:
    """What a message's fields after the timestamp describe: a growth
    (``{"grow": size, "place": [...], "add": [...]}``), a lower size
    (``{"lower": size, "removed": [...]}``), ranks to leave
    (``{"shrink": size, "hosts": [(name, slots, reported), ...]}``), or None
    for a change that needs a new world."""
    if len(fields) == 4 and fields[0] == "grow":
        place = [] if fields[2] == "-" else fields[2].split(",")
        add = [] if fields[3] == "-" else fields[3].split(",")
        return {"grow": int(fields[1]), "place": place, "add": add}
    if len(fields) == 3 and fields[0] == "lower":
        return {"lower": int(fields[1]),
                "removed": [] if fields[2] == "-" else fields[2].split(",")}
    if len(fields) == 3 and fields[0] == "shrink":
        hosts = []
        for entry in fields[2].split(","):
            name, slots, reported = entry.split(":")
            hosts.append((name, int(slots), reported))
        return {"shrink": int(fields[1]), "hosts": hosts}
    return None


def growth_line(timestamp: float, size: int, place: list[str], add: list[str]) -> str:
    """The message that says the world may grow in place (see above)."""
    return (f"hosts-updated {timestamp:.6f} grow {size} {','.join(place) or '-'} "
            f"{','.join(add) or '-'}\n")


def lower_line(timestamp: float, size: int, removed: list[str]) -> str:
    """The message that says hosts left whose ranks were lost already, and
    the world comes back to ``size`` ranks at most (see above)."""
    return f"hosts-updated {timestamp:.6f} lower {size} {','.join(removed) or '-'}\n"


def shrink_line(timestamp: float, size: int, hosts: list[tuple[str, int, str]]) -> str:
    """The message that says hosts have fewer slots (0: removed) while
    ranks of the job still run there (see above)."""
    entries = ",".join(f"{name}:{slots}:{reported}" for name, slots, reported in hosts)
    return f"hosts-updated {timestamp:.6f} shrink {size} {entries}\n"
