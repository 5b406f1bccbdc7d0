"""Pretend hosts on one Linux machine: network namespaces joined by veth
pairs to a bridge, reached by mpirun through a remote-shell agent.

Each host ``ns-a``, ``ns-b``, ... is a network namespace with one ``eth0``
whose peer sits on a bridge in the caller's namespace. The agent script
enters the namespace (and gives it its own host name) where mpirun would
call ssh, so mpirun's daemons there connect back over the bridge and MPI
traffic between ranks on different hosts crosses the veth links. ``shape``
limits every host's link to a fixed rate in both directions with a token
bucket (``tc qdisc ... tbf``), as a real network port would.

Used by the multi-host tests and by ``python -m hora.bench multihost``.
Needs root, ``ip`` (iproute2), ``unshare`` (util-linux) and, to shape the
links, ``tc``.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

HOST_NAMES = tuple(f"ns-{letter}" for letter in "abcdefgh")
PROBE_PORT = 5999

# Receives until the sender closes, then prints bytes and seconds from the
# first byte on.
_RECEIVER = """
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.listen(1)
print("listening", flush=True)
peer, _ = server.accept()
buffer = bytearray(1 << 20)
total, start = 0, None
while True:
    n = peer.recv_into(buffer)
    if not n:
        break
    if start is None:
        start = time.perf_counter()
    total += n
print(total, time.perf_counter() - (start or time.perf_counter()), flush=True)
"""

# Sends for a given number of seconds, then closes.
_SENDER = """
import socket, sys, time
peer = socket.create_connection((sys.argv[1], int(sys.argv[2])))
data = bytes(1 << 20)
end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    peer.sendall(data)
peer.close()
"""


class NetnsError(RuntimeError):
    """The namespaces cannot be built on this machine; the message says why."""


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def why_not(need_tc=False):
    """None where this machine can build the hosts, else the reason."""
    if sys.platform != "linux":
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "unshare") + (("tc",) if need_tc else ()):
        if shutil.which(tool) is None:
            return f"the '{tool}' tool is not installed (iproute2 / util-linux)"
    return None


def parse_rate(text):
    """A tc rate such as ``1gbit``, ``500mbit`` or ``2.5gbit`` in bits per
    second; ValueError for anything else."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    lowered = text.strip().lower()
    for unit, scale in units.items():
        if lowered.endswith(unit):
            try:
                value = float(lowered[:-len(unit)])
            except ValueError:
                break
            if value > 0:
                return value * scale
    raise ValueError(f"rate {text!r}: expected a number followed by kbit, mbit or gbit "
                     f"(e.g. 1gbit)")


class NetnsHosts:
    """``count`` hosts on the bridge ``hbr<tag>``, addresses
    ``<subnet>.1``, ``<subnet>.2``, ... (the bridge itself is
    ``<subnet>.254``). Use as a context manager, or ``create()`` and
    ``destroy()``."""

    def __init__(self, tag, subnet, workdir, count=2):
        if not 1 <= count <= len(HOST_NAMES):
            raise ValueError(f"hosts: between 1 and {len(HOST_NAMES)}, got {count}")
        self.hosts = HOST_NAMES[:count]
        self.bridge = f"hbr{tag}"
        self.subnet = subnet
        self.namespaces = {host: f"hora-{tag}-{host}" for host in self.hosts}
        self.veths = {host: f"hv{tag}{host[-1]}" for host in self.hosts}
        self.agent = pathlib.Path(workdir) / "netns-agent"
        self.rate_bits = None

    def __enter__(self):
        self.create()
        return self

    def __exit__(self, *exc):
        self.destroy()

    def address(self, host):
        return f"{self.subnet}.{self.hosts.index(host) + 1}"

    def create(self):
        """Builds the bridge, the namespaces and the agent; NetnsError (with
        everything built so far removed) where the machine refuses."""
        try:
            self._build()
        except subprocess.CalledProcessError as exc:
            self.destroy()
            raise NetnsError(f"this machine cannot build the namespaces: "
                             f"'{' '.join(exc.cmd)}' said {exc.stderr.strip()!r}") from None
        except BaseException:  # a timeout, an interrupt: leave nothing behind
            self.destroy()
            raise
        probe = subprocess.run([str(self.agent), self.hosts[0], "hostname"], capture_output=True,
                               text=True, timeout=30)
        if probe.returncode != 0 or probe.stdout.strip() != self.hosts[0]:
            self.destroy()
            raise NetnsError(f"cannot enter the namespaces with a host name of their own: "
                             f"{(probe.stderr or probe.stdout).strip()!r}")

    def _build(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            ns, veth = self.namespaces[host], self.veths[host]
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        # mpirun calls "agent HOST COMMAND..." where it would call ssh.
        cases = "\n".join(f"  {host}) ns={ns} ;;" for host, ns in self.namespaces.items())
        self.agent.write_text(
            "#!/bin/sh\n"
            "host=$1; shift\n"
            f'case "$host" in\n{cases}\n'
            '  *) echo "netns-agent: no namespace for host $host" >&2; exit 255 ;;\n'
            "esac\n"
            'exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $host && $*"\n')
        self.agent.chmod(0o755)

    def shape(self, rate, queue_ms=10.0):
        """Limits each host's link to ``rate`` (a tc rate such as ``1gbit``)
        in each direction: a token bucket on the host's ``eth0`` (what it
        sends) and on its peer on the bridge (what it receives). The bucket
        holds 1 ms of traffic (at least 64 KiB); ``queue_ms`` of traffic
        at the rate can wait in the queue before packets are dropped."""
        bits = parse_rate(rate)
        burst = max(64 * 1024, int(bits / 8 * 1e-3))
        tbf = ["root", "tbf", "rate", f"{int(bits)}bit", "burst", str(burst),
               "latency", f"{queue_ms}ms"]
        try:
            for host in self.hosts:
                subprocess.run(["ip", "netns", "exec", self.namespaces[host], "tc", "qdisc",
                                "replace", "dev", "eth0", *tbf], capture_output=True, text=True,
                               check=True, timeout=30)
                subprocess.run(["tc", "qdisc", "replace", "dev", self.veths[host], *tbf],
                               capture_output=True, text=True, check=True, timeout=30)
        except subprocess.CalledProcessError as exc:
            raise NetnsError(f"cannot shape the links: '{' '.join(exc.cmd)}' said "
                             f"{exc.stderr.strip()!r}") from None
        self.rate_bits = bits

    def ring_goodput(self, seconds=2.0):
        """TCP goodput in bytes per second of each link while every host
        sends to the next one around the ring at once (as a ring allreduce
        loads the links): the lowest over the hosts. With one host, None.
        NetnsError when a probe fails or does not finish in time."""
        if len(self.hosts) < 2:
            return None
        deadline = seconds + 60
        processes = []
        try:
            receivers = []
            for host in self.hosts:
                receivers.append(self.popen_in(
                    host, [sys.executable, "-c", _RECEIVER, str(PROBE_PORT)],
                    stdout=subprocess.PIPE, text=True))
                processes.append(receivers[-1])
            for receiver in receivers:
                if receiver.stdout.readline().strip() != "listening":
                    raise NetnsError("the TCP probe's receiver did not start")
            senders = []
            for i, host in enumerate(self.hosts):
                peer = self.address(self.hosts[(i + 1) % len(self.hosts)])
                senders.append(self.popen_in(
                    host, [sys.executable, "-c", _SENDER, peer, str(PROBE_PORT), str(seconds)]))
                processes.append(senders[-1])
            for sender in senders:
                if sender.wait(timeout=deadline) != 0:
                    raise NetnsError("the TCP probe's sender failed")
            rates = []
            for receiver in receivers:
                output, _ = receiver.communicate(timeout=deadline)
                total, elapsed = output.split()
                rates.append(int(total) / max(float(elapsed), 1e-9))
        except subprocess.TimeoutExpired:
            raise NetnsError(f"the TCP probe did not finish within {deadline:.0f} s") from None
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()
        time.sleep(0.2)  # let the queues drain before anything is timed
        return min(rates)

    def kill_processes(self):
        """SIGKILLs whatever still runs inside the hosts (ranks and daemons
        of a job that was cut off); returns how many processes there were."""
        killed = 0
        for ns in self.namespaces.values():
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                    killed += 1
                except (ProcessLookupError, ValueError):
                    pass
        deadline = time.monotonic() + 10
        while killed and time.monotonic() < deadline and any(
                _ip("netns", "pids", ns, check=False).stdout.split()
                for ns in self.namespaces.values()):
            time.sleep(0.1)
        return killed

    def destroy(self):
        # A namespace that still holds processes outlives its deletion, and
        # so do its veth and the processes' load.
        self.kill_processes()
        for ns in self.namespaces.values():
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)

    def tx_bytes(self):
        """Bytes each host's bridge-side veth has sent (what the host received)."""
        return {host: int(pathlib.Path(f"/sys/class/net/{veth}/statistics/tx_bytes").read_text())
                for host, veth in self.veths.items()}

    def mpi_args(self, yield_when_idle=False):
        """mpirun's arguments for a job over these hosts: the agent instead
        of ssh, and MPI's traffic and its daemons' kept on the bridge."""
        return (f"--prtemca plm_ssh_agent {self.agent} --mca btl tcp,self "
                f"--mca btl_tcp_if_include {self.subnet}.0/24 "
                f"--prtemca oob_tcp_if_include {self.subnet}.0/24"
                + (" --mca mpi_yield_when_idle 1" if yield_when_idle else ""))

    # horarun's arguments that pass job_env()'s meeting point to the ranks
    GLOO_EXPORTS = ("-x", "MASTER_ADDR", "-x", "GLOO_SOCKET_IFNAME")

    def job_env(self):
        """The environment for a horarun job over these hosts: this process's,
        less the rank variables of any job it runs in, with torch.distributed's
        gloo meeting at the first host's address through ``eth0`` (left to
        itself, each rank's gloo looks for the store on its own namespace's
        loopback and for its peers at the machine's address, which no
        namespace reaches, and waits for ever)."""
        env = {key: value for key, value in os.environ.items()
               if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
        env.update(MASTER_ADDR=self.address(self.hosts[0]), GLOO_SOCKET_IFNAME="eth0")
        return env

    def run_in(self, host, command, **kwargs):
        """``command`` (a list) run inside ``host``'s namespace."""
        return subprocess.run(["ip", "netns", "exec", self.namespaces[host], *command], **kwargs)

    def popen_in(self, host, command, **kwargs):
        return subprocess.Popen(["ip", "netns", "exec", self.namespaces[host], *command], **kwargs)
