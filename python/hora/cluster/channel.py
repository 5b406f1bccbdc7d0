"""Authenticated connections between the driver, the tasks and the ranks.

Control messages are tuples sent with ``multiprocessing.connection`` (HMAC
authentication with a per-job key); user functions and their results travel
as cloudpickle bytes, so that lambdas and functions defined in ``__main__``
work as they do with Spark and Ray.
"""
import os
import secrets
import socket
import threading
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

KEY_ENV = "HORA_CLUSTER_KEY"
DRIVER_ENV = "HORA_CLUSTER_DRIVER"
DRIVER_HOST_ENV = "HORA_CLUSTER_DRIVER_HOST"


def new_key():
    return secrets.token_bytes(32)


def _required(name, env):
    env = os.environ if env is None else env
    text = env.get(name)
    if not text:
        raise RuntimeError(f"{name} is not set: this process was not started by "
                           "hora.spark or hora.ray")
    return text


def key_from_env(env=None):
    return bytes.fromhex(_required(KEY_ENV, env))


def driver_from_env(env=None):
    host, _, port = _required(DRIVER_ENV, env).rpartition(":")
    return host, int(port)


def format_address(address):
    return f"{address[0]}:{address[1]}"


class Server:
    """Accepts authenticated connections on every interface, on a free port,
    and calls ``handler(conn, peer_ip)`` for each in a thread of its own.
    The handshake also runs in that thread, so a peer that connects and
    never speaks holds up no one else."""

    def __init__(self, key, handler):
        self._key = key
        self._handler = handler
        self._closed = False
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("0.0.0.0", 0))
        self._sock.listen(128)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept_loop, name="hora-cluster-server",
                         daemon=True).start()

    def _accept_loop(self):
        while True:
            try:
                sock, peer = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                continue
            if self._closed:
                sock.close()
                return
            threading.Thread(target=self._greet, args=(sock, peer[0]), daemon=True).start()

    def _greet(self, sock, peer_ip):
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, self._key)
            answer_challenge(conn, self._key)
        except Exception:  # noqa: BLE001 - not one of ours: drop it
            conn.close()
            return
        self._handler(conn, peer_ip)

    def close(self):
        """Stop accepting (this wakes the accept thread on Linux)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


def connect(address, key):
    return Client(tuple(address), family="AF_INET", authkey=key)


def local_address(preferred=None, env=None):
    """The address other machines reach this one at: HORA_CLUSTER_DRIVER_HOST,
    else ``preferred`` (what the engine already uses, such as
    ``spark.driver.host``), else the address of the interface that carries
    the default route, else what the host name resolves to."""
    env = os.environ if env is None else env
    if env.get(DRIVER_HOST_ENV):
        return env[DRIVER_HOST_ENV]
    if preferred:
        return preferred
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent for a UDP connect
            return probe.getsockname()[0]
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def dumps(obj):
    import cloudpickle
    return cloudpickle.dumps(obj)


def loads(data):
    import cloudpickle
    return cloudpickle.loads(data)
