"""Authenticated connections between the driver, the tasks and the ranks.

Control messages are tuples sent with ``multiprocessing.connection`` (HMAC
authentication with a per-job key); user functions and their results travel
as cloudpickle bytes, so that lambdas and functions defined in ``__main__``
work as they do with Spark and Ray.
"""
import os
import secrets
import socket
from multiprocessing.connection import Client, Listener

KEY_ENV = "HORA_CLUSTER_KEY"
DRIVER_ENV = "HORA_CLUSTER_DRIVER"
DRIVER_HOST_ENV = "HORA_CLUSTER_DRIVER_HOST"


def new_key():
    return secrets.token_bytes(32)


def key_from_env(env=None):
    env = os.environ if env is None else env
    text = env.get(KEY_ENV)
    if not text:
        raise RuntimeError(f"{KEY_ENV} is not set: this process was not started by "
                           "hora.spark or hora.ray")
    return bytes.fromhex(text)


def driver_from_env(env=None):
    env = os.environ if env is None else env
    text = env.get(DRIVER_ENV)
    if not text:
        raise RuntimeError(f"{DRIVER_ENV} is not set: this process was not started by "
                           "hora.spark or hora.ray")
    host, _, port = text.rpartition(":")
    return host, int(port)


def format_address(address):
    return f"{address[0]}:{address[1]}"


def listen(key):
    """A listener on every interface, on a free port."""
    return Listener(("0.0.0.0", 0), family="AF_INET", authkey=key, backlog=128)


def close_listener(listener):
    """Close ``listener`` and wake the thread blocked in its accept() (on
    Linux, closing the socket alone leaves that thread waiting)."""
    port = listener.address[1]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        pass
    listener.close()


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
