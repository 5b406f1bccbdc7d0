"""Rank 0's line to horarun: a background thread that turns horarun's
"hosts changed" messages into ``state.on_hosts_updated`` calls.

The messages are text lines ``hosts-updated <timestamp>`` on a TCP
connection to the address horarun gives in ``HORA_ELASTIC_SUPERVISOR``.
"""

from __future__ import annotations

import socket
import sys
import threading
from typing import Any


class HostUpdateListener:
    def __init__(self, address: str):
        host, _, port = address.rpartition(":")
        self._address = (host, int(port))
        self._states: list[Any] = []
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
                    kind, _, value = line.strip().partition(" ")
                    if kind != "hosts-updated":
                        continue
                    with self._lock:
                        states = list(self._states)
                    for state in states:
                        state.on_hosts_updated(float(value))
        except (OSError, ValueError) as error:
            print(f"hora.elastic: lost the connection to horarun at {self._address[0]}:"
                  f"{self._address[1]} ({error}); host changes will not be noticed until the "
                  f"next reset", file=sys.stderr, flush=True)
