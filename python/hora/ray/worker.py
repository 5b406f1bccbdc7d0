"""The Ray actor behind each rank: it hosts the task service that mpirun's
daemon runs in, and passes calls to its rank."""
import socket
import threading

from hora.cluster import channel
from hora.cluster.job import JobError


class RankWorker:
    def __init__(self):
        self._rank = None
        self._conn = None
        self._lock = threading.Lock()

    def hostname(self):
        return socket.gethostname()

    def start_service(self, index, driver_address, key):
        """Start the task service and register with the driver; the service
        lives until the driver releases it or this actor ends."""
        from hora.cluster.task_service import serve
        threading.Thread(target=serve, args=(index, tuple(driver_address), key),
                         name="hora-task", daemon=True).start()
        return socket.gethostname()

    def attach(self, rank, address, key):
        self._rank = rank
        self._conn = channel.connect(tuple(address), key)
        return True

    def execute(self, payload):
        """Run a cloudpickled ``(fn, args, kwargs, with_executable)`` on this
        actor's rank and return its value; a rank that raised, or whose job
        has ended, raises JobError."""
        with self._lock:
            host = socket.gethostname()
            if self._conn is None:
                raise JobError(f"rank {self._rank}: no hora job is running (start() first, or "
                               "the job has ended)", rank=self._rank, host=host)
            try:
                self._conn.send(("call", payload))
                reply = self._conn.recv()
            except (EOFError, OSError):
                self._conn = None
                raise JobError(f"rank {self._rank} (host {host}) is gone: its MPI job ended "
                               "(another rank failed, or an actor died)",
                               rank=self._rank, host=host) from None
            if reply[0] == "ok":
                return channel.loads(reply[1])
            self._conn = None
            _, error_type, text, failed_at = reply
            last = text.rstrip().splitlines()[-1] if text else error_type
            error = JobError(f"rank {self._rank} (host {host}) raised {last}\n"
                             f"--- traceback on rank {self._rank} ---\n{text}",
                             rank=self._rank, host=host, error_type=error_type,
                             remote_traceback=text)
            error.failed_at = failed_at
            raise error

    def stop(self):
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.send(("stop", None))
                    self._conn.recv()
                except (EOFError, OSError):
                    pass
                self._conn.close()
                self._conn = None
        return True
