"""A real multi-host job on one machine.

Two network namespaces, each joined by a veth pair to a bridge in this
namespace, act as hosts ``ns-a`` and ``ns-b``. horarun reaches them through
a remote-shell agent that enters the namespace (and gives it its own host
name) instead of logging in with ssh; mpirun's daemons there connect back
over the bridge, and MPI traffic between the ranks crosses the veth links.
Needs root and the ``ip`` and ``unshare`` tools; skipped, with the reason,
where the machine cannot create namespaces.
"""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

from hora.runner import mpi_command

ROOT = pathlib.Path(__file__).resolve().parent
JOB_TIMEOUT_SECONDS = 600
HOSTS = ("ns-a", "ns-b")


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _why_not():
    if sys.platform != "linux":
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the '{tool}' tool is not installed (iproute2 / util-linux)"
    try:
        flavour = mpi_command.query_flavour(mpi_command.find_mpirun())
    except mpi_command.MpiError as exc:
        return f"no usable mpirun: {exc}"
    if flavour != mpi_command.OPEN_MPI:
        return "the remote-shell agent is wired up for Open MPI's launcher"
    return None


class FakeHosts:
    def __init__(self, tag, subnet, workdir):
        self.bridge = f"hbr{tag}"
        self.subnet = subnet
        self.namespaces = {host: f"hora-{tag}-{host}" for host in HOSTS}
        self.veths = {host: f"hv{tag}{host[-1]}" for host in HOSTS}
        self.agent = workdir / "netns-agent"

    def create(self):
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for index, host in enumerate(HOSTS, start=1):
            ns, veth = self.namespaces[host], self.veths[host]
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{self.subnet}.{index}/24", "dev", "eth0")
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

    def destroy(self):
        for ns in self.namespaces.values():
            _ip("netns", "del", ns, check=False)
        _ip("link", "del", self.bridge, check=False)

    def tx_bytes(self):
        return {host: int(pathlib.Path(f"/sys/class/net/{veth}/statistics/tx_bytes").read_text())
                for host, veth in self.veths.items()}

    def mpi_args(self, yield_when_idle=False):
        return (f"--prtemca plm_ssh_agent {self.agent} --mca btl tcp,self "
                f"--mca btl_tcp_if_include {self.subnet}.0/24 "
                f"--prtemca oob_tcp_if_include {self.subnet}.0/24"
                + (" --mca mpi_yield_when_idle 1" if yield_when_idle else ""))


@pytest.fixture(scope="module")
def fake_hosts(tmp_path_factory):
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    tag = str(os.getpid() % 100000)
    hosts = FakeHosts(tag, f"10.231.{os.getpid() % 250}", tmp_path_factory.mktemp("netns"))
    try:
        hosts.create()
    except subprocess.CalledProcessError as exc:
        hosts.destroy()
        pytest.skip(f"this machine cannot build the namespaces: '{' '.join(exc.cmd)}' said "
                    f"{exc.stderr.strip()!r}")
    probe = subprocess.run([str(hosts.agent), "ns-a", "hostname"], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0 or probe.stdout.strip() != "ns-a":
        hosts.destroy()
        pytest.skip(f"cannot enter the namespaces with a host name of their own: "
                    f"{(probe.stderr or probe.stdout).strip()!r}")
    yield hosts
    hosts.destroy()


def horarun(fake_hosts, host_arg, command, extra_env=None, options=(), yield_when_idle=False):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    env.update(extra_env or {})
    cmd = [sys.executable, "-m", "hora.runner", "-np", str(sum(int(h.split(":")[1])
                                                               for h in host_arg.split(","))),
           "-H", host_arg, "--mpi-args", fake_hosts.mpi_args(yield_when_idle), *options, *command]
    return subprocess.run(cmd, cwd=ROOT.parent, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=JOB_TIMEOUT_SECONDS)


def test_ranks_run_in_their_own_hosts(fake_hosts):
    script = ("import os, socket\n"
              "print(os.environ['HORA_RANK'], socket.gethostname(),\n"
              "      os.readlink('/proc/self/ns/net'))\n")
    done = horarun(fake_hosts, "ns-a:1,ns-b:1", [sys.executable, "-c", script])
    assert done.returncode == 0, done.stdout
    seen = {}
    for line in done.stdout.splitlines():
        _, rank, host, netns = line.split()
        seen[int(rank)] = (host, netns)
    assert [seen[r][0] for r in (0, 1)] == ["ns-a", "ns-b"]
    assert seen[0][1] != seen[1][1] != os.readlink("/proc/self/ns/net")


@pytest.mark.parametrize("host_arg", ["ns-a:1,ns-b:1", "ns-a:2,ns-b:2"])
def test_collective_suite_across_hosts(fake_hosts, host_arg):
    ranks = sum(int(h.split(":")[1]) for h in host_arg.split(","))
    # The mismatch-message and subset-init tests spell out expectations for
    # world sizes up to 3.
    skip = [f"--ignore={ROOT / 'parallel' / name}"
            for name in ("test_mismatch_errors.py", "test_shutdown_reinit.py")] if ranks > 3 else []
    # Each pretend host believes it has all of this machine's cores, so with
    # two ranks on each, twice as many ranks as cores would be pinned and
    # busy-waiting. Tell every layer the truth: no pinning, MPI yields when
    # idle, hora does not spin.
    options, env = [], {"HORA_TEST_REAL_HOSTS": "2", "HORA_TEST_FAKE_HOSTS": "0"}
    if ranks > mpi_command.usable_cores():
        options = ["--binding-args", ""]
        env["HORA_SPIN_US"] = "0"
    before = fake_hosts.tx_bytes()
    done = horarun(fake_hosts, host_arg,
                   [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-o", "faulthandler_timeout=240", *skip, str(ROOT / "parallel")],
                   extra_env=env, options=options,
                   yield_when_idle=ranks > mpi_command.usable_cores())
    summary = [line for line in done.stdout.splitlines() if " passed" in line or " failed" in line]
    print(f"{host_arg}:\n" + "\n".join(summary))
    assert done.returncode == 0, done.stdout[-20000:]
    assert len([line for line in summary if " passed" in line and "failed" not in line]) == ranks
    sent = {host: fake_hosts.tx_bytes()[host] - before[host] for host in HOSTS}
    # Every collective of the suite crossed the links: megabytes each way.
    assert all(count > 1_000_000 for count in sent.values()), sent


def test_dead_rank_on_a_remote_host_is_named(fake_hosts):
    script = ("import os, signal, numpy as np, hora\n"
              "hora.init()\n"
              "for step in range(1000000):\n"
              "    hora.allreduce(np.ones(1000, np.float32), name='grad')\n"
              "    if step == 20 and hora.rank() == 1:\n"
              "        os.kill(os.getpid(), signal.SIGKILL)\n")
    began = time.monotonic()
    done = horarun(fake_hosts, "ns-a:1,ns-b:1", [sys.executable, "-c", script])
    assert done.returncode == 128 + signal.SIGKILL, done.stdout
    assert "horarun: rank 1 on host ns-b failed first (killed by SIGKILL)" in done.stdout
    assert time.monotonic() - began < 30


def test_elastic_job_loses_a_whole_host_and_gets_it_back(fake_hosts, tmp_path):
    """Every process of host ns-b (its rank and mpirun's daemon) is SIGKILLed
    and ns-b leaves the discovery script's list: the job goes on with the
    rank on ns-a from its last commit; ns-b listed again, the world grows
    back to two ranks at a commit."""
    pytest.importorskip("torch")
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("ns-a:1\nns-b:1\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    discover.chmod(0o755)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "HORA_TEST_"))}
    env.update(HORA_TEST_STEP_SLEEP="0.15", HORA_TEST_OUT=str(tmp_path / "out"),
               HORA_ELASTIC_STATE_DIR=str(tmp_path / "state"))
    cmd = [sys.executable, "-m", "hora.runner", "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discover),
           "--supervisor-address", f"{fake_hosts.subnet}.254",
           "--mpi-args", fake_hosts.mpi_args(), sys.executable,
           str(ROOT / "elastic" / "train_elastic.py")]
    job = subprocess.Popen(cmd, cwd=ROOT.parent, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    lines, worlds = [], 0
    try:
        for line in job.stdout:
            lines.append(line)
            if "world of 2 from" in line and worlds == 0:
                worlds = 1
                hosts_file.write_text("ns-a:1\n")
                pids = subprocess.run(["ip", "netns", "pids", fake_hosts.namespaces["ns-b"]],
                                      capture_output=True, text=True).stdout.split()
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            elif "world of 1 from" in line and worlds == 1:
                worlds = 2
                hosts_file.write_text("ns-a:1\nns-b:1\n")
        job.wait(timeout=JOB_TIMEOUT_SECONDS)
    finally:
        if job.poll() is None:
            job.kill()
    output = "".join(lines)
    assert job.returncode == 0, output[-20000:]
    assert worlds == 2, output[-20000:]
    assert "horarun: world 2: 1 rank(s) on ns-a:1" in output, output[-20000:]
    assert "horarun: more slots found (ns-a:1, ns-b:1)" in output, output[-20000:]
    assert "horarun: world 3: 2 rank(s) on ns-a:1, ns-b:1" in output, output[-20000:]
    import torch
    results = [torch.load(tmp_path / f"out.rank{r}.pt") for r in range(2)]
    assert all(result["size"] == 2 and result["resets"] == 2 for result in results)
    for got, want in zip(results[1]["params"], results[0]["params"]):
        assert torch.equal(got, want)
