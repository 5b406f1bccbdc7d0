"""The launcher's rendezvous for hora's own TCP transport: it decides who is
in each world of a job.

The processes connect once, at ``hora.init()``, and keep the connection for
their whole life. Each world is formed the same way: every member of the
current world asks to be in the next one (``FORM``), and once every member
the launcher counts as alive has asked, each gets the world's member list
and its rank in it (``WORLD``), and they connect to one another. After a
loss the survivors ask again; the lost process's connection has closed, so
the next world is formed without it, in place, with nobody relaunched.

A world grows the same way: its rank 0 asks for processes (``SPAWN``), which
``on_spawn`` starts; each asks where it will be (``PLACE``), and once it is
ready it asks to join (``FORM join``); the members' next ``FORM merge``
takes in those that are ready. A world re-formed after a loss (``FORM
shrink``) takes in none: processes started for the old world are ended.

A process whose host was removed leaves (``LEAVE``), and the others form
the next world without it, as after a loss (``FORM shrink``).

A process that does not ask within ``form_timeout`` seconds of the first
one that did (a stopped process, a host that vanished without closing its
connections) is counted as lost: ``on_lost`` is told, so that the launcher
can end it, and the world is formed without it.

The wire protocol is described in csrc/hora/comm/tcp/tcp_rendezvous.h.
"""

from __future__ import annotations

import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable


@dataclass
class _Process:
    id: int
    conn: socket.socket | None = None
    alive: bool = True
    # what it sent with FORM: kind, hostname, port, addresses
    asked: tuple[str, str, str, str] | None = None
    spawn: int | None = None      # the spawn that started it, until it joins
    place_host: str | None = None  # its hostname, once it asked PLACE


class Rendezvous:
    """Serves one job: the processes with ids ``ids`` form its first world
    (ranks in id order). ``on_spawn(ids, hosts, argv)`` starts the
    processes a world asks for (``hosts``: ``host:count`` entries, possibly
    empty); ``on_lost(id, why)`` ends a process the rendezvous gave up on."""

    def __init__(self, ids: list[int], *, host: str = "0.0.0.0", form_timeout: float = 10.0,
                 start_timeout: float = 600.0,
                 on_lost: Callable[[int, str], None] | None = None,
                 on_spawn: Callable[[list[int], list[str], list[str]], None] | None = None,
                 log: Callable[[str], None] | None = None):
        self.cookie = secrets.randbits(62)
        self.form_timeout = form_timeout
        self.start_timeout = start_timeout
        self.on_lost = on_lost
        self.on_spawn = on_spawn
        self.log = log or (lambda text: print(f"horarun: {text}", file=sys.stderr, flush=True))
        self.generation = 0
        self.members: list[int] = []  # the current world's ids, in rank order
        self._member_hosts: list[str] = []
        self._processes = {i: _Process(i) for i in ids}
        self._next_id = max(ids, default=-1) + 1
        self._spawns = 0
        self._spawn_failure: dict[int, str] = {}
        # the generation of the world whose rank 0 asked for each spawn
        self._spawn_generation: dict[int, int] = {}
        self._lock = threading.Lock()
        self._round_started: float | None = None
        self._closed = False
        self._listener = socket.create_server((host, 0), backlog=256)
        self.port = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True,
                                          name="hora-rendezvous-accept"),
                         threading.Thread(target=self._watch, daemon=True,
                                          name="hora-rendezvous-timeout")]
        for thread in self._threads:
            thread.start()

    def env(self, process_id: int, address: str) -> dict[str, str]:
        """What a process needs in its environment to find the rendezvous at
        ``address`` (an address of this host its processes can reach)."""
        return {"HORA_RENDEZVOUS": f"{address}:{self.port}",
                "HORA_RENDEZVOUS_COOKIE": str(self.cookie),
                "HORA_PROCESS_ID": str(process_id)}

    def lost(self, process_id: int, why: str) -> None:
        """The launcher saw the process end (or could not start it)."""
        with self._lock:
            self._lose(process_id, why)
            self._maybe_form()

    def alive(self) -> list[int]:
        with self._lock:
            return sorted(i for i, p in self._processes.items() if p.alive)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for process in self._processes.values():
                if process.conn is not None:
                    process.conn.close()
        self._listener.close()

    # -- the threads -----------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="hora-rendezvous-conn").start()

    def _serve(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        process = None
        try:
            hello = reader.readline().decode(errors="replace").split()
            if len(hello) != 3 or hello[0] != "HELLO" or hello[1] != str(self.cookie):
                conn.close()
                return
            with self._lock:
                process = self._processes.get(int(hello[2]))
                if process is None or not process.alive or process.conn is not None:
                    conn.close()
                    return
                process.conn = conn
            for raw in reader:
                words = raw.decode(errors="replace").split()
                if not words:
                    continue
                if words[0] == "SPAWN" and len(words) == 4:
                    argv = [bytes.fromhex(reader.readline().decode().strip()).decode(
                        errors="surrogateescape") for _ in range(int(words[3]))]
                    self._spawn(int(words[1]), [] if words[2] == "-" else words[2].split(","),
                                argv)
                    continue
                with self._lock:
                    if not process.alive:
                        break
                    if words[0] == "FORM" and len(words) == 5:
                        process.asked = (words[1], words[2], words[3], words[4])
                        if self._round_started is None and process.spawn is None:
                            self._round_started = time.monotonic()
                        self._maybe_form()
                    elif words[0] == "SPAWNSTATE":
                        conn.sendall(f"SPAWNSTATE {self._spawn_state()}\n".encode())
                    elif words[0] == "LEAVE":
                        # its host was removed: the next world goes on without it
                        self._lose(process.id, "it left the job")
                        if process.id in self.members:
                            self.log(f"rank {self.members.index(process.id)} (process "
                                     f"{process.id}) leaves the job (its host was removed or "
                                     f"has fewer slots)")
                        self._maybe_form()
                        break
                    elif words[0] == "CANCEL" and len(words) == 2:
                        # Only the spawns of the world named: a CANCEL that
                        # arrives after the next world asked for processes
                        # leaves those alone.
                        for spawn, generation in self._spawn_generation.items():
                            if generation == int(words[1]):
                                self._end_spawn(spawn, "the world did not take it in")
                    elif words[0] == "PLACE" and len(words) == 2:
                        process.place_host = words[1]
                        self._maybe_place(process.spawn)
        except (OSError, ValueError):
            pass
        finally:
            if process is not None:
                with self._lock:
                    self._lose(process.id, "its process ended (its connection to horarun closed)")
                    self._maybe_form()

    def _watch(self) -> None:
        while not self._closed:
            time.sleep(0.1)
            with self._lock:
                if self._round_started is None:
                    continue
                limit = self.start_timeout if not self.members else self.form_timeout
                if time.monotonic() - self._round_started < limit:
                    continue
                for process in list(self._processes.values()):
                    if process.alive and process.spawn is None and process.asked is None:
                        self._lose(process.id, f"it did not take part in forming a world within "
                                               f"{limit:g} s (stopped, or its host is gone); "
                                               f"ending it", say=True)
                        if self.on_lost is not None:
                            self.on_lost(process.id, "excluded")
                self._maybe_form()

    def _spawn(self, count: int, hosts: list[str], argv: list[str]) -> None:
        with self._lock:
            self._spawns += 1
            self._spawn_generation[self._spawns] = self.generation
            ids = list(range(self._next_id, self._next_id + count))
            self._next_id += count
            for i in ids:
                self._processes[i] = _Process(i, spawn=self._spawns)
        if self.on_spawn is None:
            with self._lock:
                self._end_spawn(self._spawns, "this launcher starts no processes")
            return
        self.on_spawn(ids, hosts, argv)

    # -- with the lock held ----------------------------------------------

    def _lose(self, process_id: int, why: str, say: bool = False) -> None:
        """(The launcher reports processes that fail; a process excluded
        here is reported here, ``say``.)"""
        process = self._processes.get(process_id)
        if process is None or not process.alive:
            return
        process.alive = False
        process.asked = None
        if process.spawn is not None:
            self._spawn_failure.setdefault(process.spawn, f"process {process_id}: {why}")
            self._maybe_place(process.spawn)
        if say and process_id in self.members:
            self.log(f"rank {self.members.index(process_id)} (process {process_id}) lost: {why}")
        if process.conn is not None:
            try:
                process.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _spawned(self, spawn: int | None) -> list[_Process]:
        return [p for p in self._processes.values() if spawn is not None and p.spawn == spawn]

    def _spawn_state(self) -> str:
        if self._spawns in self._spawn_failure:
            return f"failed {self._spawn_failure[self._spawns]}"
        spawned = self._spawned(self._spawns)
        if spawned and all(p.alive and p.asked is not None for p in spawned):
            return "ready"
        return "starting"

    def _end_spawn(self, spawn: int, why: str) -> None:
        for process in self._spawned(spawn):
            if process.alive:
                self._lose(process.id, why)
                if self.on_lost is not None:
                    self.on_lost(process.id, why)

    def _maybe_place(self, spawn: int | None) -> None:
        """Answers the processes of ``spawn`` where they will be, once each
        that is alive has asked."""
        spawned = [p for p in self._spawned(spawn) if p.alive]
        if not spawned or any(p.place_host is None for p in spawned):
            return
        hosts = self._member_hosts + [p.place_host or "" for p in spawned]
        for index, process in enumerate(spawned):
            if process.conn is None or process.place_host == "":
                continue
            text = f"PLACE {len(self._member_hosts) + index} {len(hosts)}\n" + \
                "".join(f"{h}\n" for h in hosts)
            try:
                process.conn.sendall(text.encode())
            except OSError:
                pass
            process.place_host = ""  # answered

    def _maybe_form(self) -> None:
        alive = [p for p in self._processes.values() if p.alive]
        members = [self._processes[i] for i in self.members if self._processes[i].alive]
        waiting = members if self.members else [p for p in alive if p.spawn is None]
        if not waiting or any(p.asked is None for p in waiting):
            return
        shrink = any(p.asked is not None and p.asked[0] == "shrink" for p in members)
        joining = [] if shrink else sorted(
            (p for p in alive if p.spawn is not None and p.asked is not None
             and p.asked[0] == "join"), key=lambda p: p.id)
        if shrink:
            # processes started for the old world are not taken in
            self._end_spawn(self._spawns, "the world it was started for lost a rank")
        # Ranks: the current world's survivors in their order, then the
        # newcomers by id.
        ids = [p.id for p in waiting] + [p.id for p in joining]
        self.generation += 1
        cookie = secrets.randbits(62)
        lines = "".join(" ".join((self._processes[i].asked or ("",))[1:]) + "\n" for i in ids)
        for rank, i in enumerate(ids):
            process = self._processes[i]
            message = f"WORLD {self.generation} {rank} {len(ids)} {cookie}\n" + lines
            try:
                if process.conn is not None:  # (it asked, so it is connected)
                    process.conn.sendall(message.encode())
            except OSError:
                pass  # its connection's end is seen by its reader: the next world goes without it
        self._member_hosts = [(self._processes[i].asked or ("", ""))[1] for i in ids]
        for i in ids:
            self._processes[i].asked = None
            self._processes[i].spawn = None
        if self.members and len(ids) < len(self.members):
            self.log(f"the world is formed again in place: {len(ids)} rank(s) "
                     f"(was {len(self.members)})")
        self.members = ids
        self._round_started = None
