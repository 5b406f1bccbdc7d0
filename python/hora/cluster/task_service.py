"""The service every Spark task or Ray actor runs: it registers with the
driver and runs the MPI daemon command that mpirun's ssh agent hands it."""
import os
import socket
import subprocess
import sys
import threading

from hora.cluster import channel, processes
from hora.runner.rank_exec import die_with_parent


class TaskService:
    """Listens for ``("exec", command)`` from the ssh agent, runs the command
    with ``/bin/sh -c`` and streams its output and exit code back. Everything
    it started is killed on :meth:`shutdown` or when the agent goes away."""

    def __init__(self, key):
        self._key = key
        self._procs = set()
        self._lock = threading.Lock()
        self._closed = False
        self._server = channel.Server(key, self._serve)
        self.port = self._server.port

    def _serve(self, conn, _peer_ip):
        with conn:
            try:
                request = conn.recv()
            except (EOFError, OSError):
                return
            if request[0] != "exec":
                conn.send(("error", f"unknown request {request[0]!r}"))
                return
            self._run(conn, request[1])

    def _run(self, conn, command):
        with self._lock:
            if self._closed:
                conn.send(("exit", 255))
                return
            proc = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    preexec_fn=die_with_parent)
            self._procs.add(proc)
        send_lock = threading.Lock()
        agent_gone = threading.Event()

        def relay(pipe, stream):
            for chunk in iter(lambda: pipe.read1(65536), b""):
                try:
                    with send_lock:
                        conn.send(("out", stream, chunk))
                except OSError:
                    agent_gone.set()
            pipe.close()

        def watch_agent():
            # the agent sends nothing after its request: EOF means it is gone
            try:
                conn.recv()
            except (EOFError, OSError):
                pass
            agent_gone.set()
            if proc.poll() is None:
                processes.kill_tree(proc)

        relays = [threading.Thread(target=relay, args=(proc.stdout, 1), daemon=True),
                  threading.Thread(target=relay, args=(proc.stderr, 2), daemon=True)]
        for thread in relays:
            thread.start()
        threading.Thread(target=watch_agent, daemon=True).start()
        code = proc.wait()
        for thread in relays:
            thread.join(timeout=5)
        with self._lock:
            self._procs.discard(proc)
        if not agent_gone.is_set():
            try:
                with send_lock:
                    conn.send(("exit", code))
            except OSError:
                pass

    def shutdown(self):
        with self._lock:
            self._closed = True
            procs = list(self._procs)
        for proc in procs:
            if proc.poll() is None:
                processes.kill_tree(proc)
        self._server.close()


def serve(index, driver_address, key, hostname=None):
    """Run a task service for the task ``index`` until the driver says the
    job is over (or goes away). Returns the driver's last word."""
    service = TaskService(key)
    hostname = hostname or socket.gethostname()
    try:
        with channel.connect(driver_address, key) as conn:
            conn.send(("register", index, hostname, service.port, os.getpid()))
            try:
                return conn.recv()
            except (EOFError, OSError):
                return ("driver-gone",)
    finally:
        service.shutdown()


if __name__ == "__main__":  # pragma: no cover - for trying the service by hand
    print(serve(int(sys.argv[1]), channel.driver_from_env(), channel.key_from_env()))
