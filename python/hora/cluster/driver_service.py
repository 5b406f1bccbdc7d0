"""The driver's side: where tasks register, where the ssh agent looks up a
host's task service, and where ranks fetch their function and leave their
result."""
import dataclasses
import threading
import time

from hora.cluster import channel


@dataclasses.dataclass(frozen=True)
class Task:
    index: int
    hostname: str
    address: tuple      # (ip the driver saw it connect from, its service port)
    pid: int


@dataclasses.dataclass(frozen=True)
class HostGroup:
    alias: str          # the name mpirun knows the host by
    hostname: str
    tasks: tuple        # task indices on the host, lowest first


@dataclasses.dataclass(frozen=True)
class RankResult:
    rank: int
    hostname: str
    ok: bool
    payload: object     # the result's cloudpickle bytes, or the error's text
    error_type: str = ""
    failed_at: float = 0.0  # the rank's clock when it raised


def group_hosts(tasks):
    """Tasks by host, hosts in the order of their lowest task index; each
    host gets a pseudonym that no resolver knows, so that mpirun treats
    every host (this one included) as remote and goes through the agent."""
    by_host = {}
    for task in sorted(tasks, key=lambda t: t.index):
        by_host.setdefault(task.hostname, []).append(task.index)
    return [HostGroup(f"hora-host-{i}", hostname, tuple(indices))
            for i, (hostname, indices) in enumerate(by_host.items())]


class DriverService:
    def __init__(self, key, host):
        self.key = key
        self._server = channel.Server(key, self._serve)
        self.address = (host, self._server.port)
        self._cond = threading.Condition()
        self._tasks = {}
        self._groups = {}
        self._payload = None
        self._results = {}
        self._rank_addresses = {}
        self._released = None

    # -- the network side --------------------------------------------------
    def _serve(self, conn, peer_ip):
        with conn:
            try:
                while True:
                    request = conn.recv()
                    if request[0] == "register":
                        self._register(conn, peer_ip, *request[1:])
                        return
                    conn.send(self._answer(peer_ip, request))
            except (EOFError, OSError):
                return

    def _register(self, conn, peer_ip, index, hostname, port, pid):
        with self._cond:
            self._tasks[index] = Task(index, hostname, (peer_ip, port), pid)
            self._cond.notify_all()
            while self._released is None:
                self._cond.wait()
            word = self._released
        try:
            conn.send(word)
        except OSError:
            pass

    def _answer(self, peer_ip, request):
        kind = request[0]
        with self._cond:
            if kind == "task_address":
                group = self._groups.get(request[1])
                if group is None:
                    return ("error", f"no task registered for host {request[1]!r} "
                                     f"(known: {sorted(self._groups)})")
                return ("ok", self._tasks[group.tasks[0]].address)
            if kind == "job":
                if self._payload is None:
                    return ("error", "the driver has no function to run")
                return ("ok", self._payload)
            if kind == "result":
                self._results.setdefault(request[1], RankResult(*request[1:]))
                self._cond.notify_all()
                return ("ok",)
            if kind == "rank_ready":
                rank, hostname, port = request[1:]
                self._rank_addresses[rank] = (hostname, (peer_ip, port))
                self._cond.notify_all()
                return ("ok",)
        return ("error", f"unknown request {kind!r}")

    # -- the driver's side -------------------------------------------------
    def tasks(self):
        with self._cond:
            return dict(self._tasks)

    def wait_for_tasks(self, count, timeout, abandoned=lambda: None):
        """Wait until ``count`` tasks have registered. Returns None when they
        have; otherwise the reason: "timeout", or what ``abandoned()``
        returned (a message: the engine gave up on the tasks)."""
        return self._wait_for(self._tasks, count, timeout, abandoned)

    def set_hosts(self, groups):
        with self._cond:
            self._groups = {group.alias: group for group in groups}

    def set_job(self, payload):
        with self._cond:
            self._payload = payload
            self._results = {}

    def results(self):
        with self._cond:
            return dict(self._results)

    def rank_addresses(self):
        """{rank: (hostname, (ip, port))} of the serving ranks (Ray)."""
        with self._cond:
            return dict(self._rank_addresses)

    def wait_for_rank_addresses(self, count, timeout, stopped=lambda: None):
        """As wait_for_tasks, for ``count`` serving ranks."""
        return self._wait_for(self._rank_addresses, count, timeout, stopped)

    def _wait_for(self, registry, count, timeout, abandoned):
        deadline = None if not timeout else time.monotonic() + timeout
        with self._cond:
            while len(registry) < count:
                reason = abandoned()
                if reason:
                    return reason
                if deadline is not None and time.monotonic() >= deadline:
                    return "timeout"
                self._cond.wait(0.2)
        return None

    def release_tasks(self, word=("finish",)):
        """Let every registered task (and any that registers later) end."""
        with self._cond:
            if self._released is None:
                self._released = word
            self._cond.notify_all()

    def close(self):
        self.release_tasks()
        self._server.close()
