"""hora's container images, built and run.

``scripts/build_images.sh`` builds ``hora:cpu`` (its own Debian base where no
registry can be reached, its layers and the base rootfs cached between runs).
In it the PyTorch example trains as root, as the image's user ``hora`` and
as an arbitrary uid. Containers on one podman network then act as hosts:
the Kubeflow MPIJob manifests' launcher and worker commands run as they are
written (as root and as uid 1000), ``horarun -H c1:1,c2:1`` from the first
container reaches the second over ssh, and killing the second container
stops the job at once, naming the host and its rank; with elastic options
the job goes on in the first container.

Needs podman (or a running Docker engine); elsewhere the tests are skipped,
with the reason. ``scripts/run_tests.sh`` installs podman where it runs as
root with apt.
"""
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
IMAGE = "hora:cpu"
BUILD_TIMEOUT_SECONDS = 1800
JOB_TIMEOUT_SECONDS = 300
MANIFESTS = {"root": ROOT / "examples" / "kubernetes" / "mpijob.yaml",
             "non-root": ROOT / "examples" / "kubernetes" / "mpijob-nonroot.yaml"}


def _why_not():
    if shutil.which("podman"):
        info = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=120)
        if info.returncode != 0:
            return f"podman cannot run here: {(info.stderr or info.stdout).strip()[-500:]}"
        return None
    if shutil.which("docker"):
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=120)
        if info.returncode == 0:
            return None
        return "podman is not installed and the docker client finds no running Docker engine"
    return "neither podman nor docker is installed (apt-get install podman runc mmdebstrap)"


class Engine:
    """podman (or docker) with the flags this host needs, as
    ``scripts/build_images.sh --engine-args`` reports them."""

    def __init__(self):
        lines = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"),
                                "--engine-args"], capture_output=True, text=True, check=True,
                               timeout=60).stdout.splitlines()
        self.command = shlex.split(lines[0])
        self.run_flags = shlex.split(lines[1]) if len(lines) > 1 else []
        self.cleanup = []

    def __call__(self, *args, timeout=JOB_TIMEOUT_SECONDS, check=True):
        try:
            done = subprocess.run([*self.command, *args], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace",
                                  timeout=timeout)
        except subprocess.TimeoutExpired as error:
            output = error.stdout or b""
            if isinstance(output, bytes):
                output = output.decode(errors="replace")
            # What the job printed, hora's warnings included: a collective
            # stuck in the transport is named after the stall check time.
            pytest.fail(f"{' '.join(args[:8])}... still ran after {timeout} s:\n"
                        f"{output[-8000:]}")
        if check:
            assert done.returncode == 0, f"{' '.join(args[:3])}... failed:\n{done.stdout[-5000:]}"
        return done

    def run(self, *args, timeout=JOB_TIMEOUT_SECONDS, check=True):
        return self("run", "--rm", *self.run_flags, *args, timeout=timeout, check=check)

    def start(self, name, *args):
        """Starts a detached container called ``name`` (also its host name)."""
        self.cleanup.append(("rm", "-f", name))
        self("run", "-d", "--rm", *self.run_flags, "--name", name, "--hostname", name, *args)

    def network(self):
        name = f"hora-test-{uuid.uuid4().hex[:8]}"
        self.cleanup.append(("network", "rm", "-f", name))
        self("network", "create", name)
        return name

    def wait_for_sshd(self, name):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            logs = self("logs", name, check=False).stdout
            if "Server listening" in logs:
                return
            time.sleep(0.2)
        pytest.fail(f"sshd in {name} did not start:\n{logs[-3000:]}")

    def wait_for_name(self, name, other):
        """Waits until container ``name`` resolves ``other`` (the network's
        DNS learns a new container's name a moment after it starts)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self("exec", name, "getent", "hosts", other, check=False).returncode == 0:
                return
            time.sleep(0.2)
        pytest.fail(f"{name} cannot resolve {other}")

    def tidy(self):
        while self.cleanup:
            self(*self.cleanup.pop(), check=False, timeout=120)


@pytest.fixture(scope="module")
def engine():
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    build = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"), "cpu"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=BUILD_TIMEOUT_SECONDS)
    assert build.returncode == 0, f"scripts/build_images.sh cpu failed:\n{build.stdout[-10000:]}"
    assert re.search(r"hora:cpu built in \d+ s; size \d+ MB", build.stdout), build.stdout[-3000:]
    yield Engine()


@pytest.fixture
def containers(engine):
    yield engine
    engine.tidy()


def _cpuset(index):
    """Pins container ``index`` to a core of its own where there are enough,
    so that two containers act as two one-core hosts."""
    cores = sorted(os.sched_getaffinity(0))
    return ["--cpuset-cpus", str(cores[index % len(cores)])] if len(cores) >= 2 else []


def _accuracy(output):
    found = re.search(r"final test accuracy ([0-9.]+)", output)
    assert found, output[-5000:]
    return float(found.group(1))


def _ssh_keys(directory, uid):
    """A key pair and authorized_keys, named as the MPI Operator's Secret
    mounts them, owned by the user who logs in with them."""
    directory.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ecdsa", "-N", "", "-f", str(directory / "id_rsa")],
                   check=True, timeout=60)
    shutil.copy(directory / "id_rsa.pub", directory / "authorized_keys")
    for path in (directory, *directory.iterdir()):
        os.chown(path, uid, uid)
    return directory


@pytest.mark.parametrize("user", ["root", "hora", "12345:0"])
def test_the_cpu_image_trains_the_example(containers, user):
    """The image's default command: horarun -np 2 with the PyTorch example,
    as root, as the image's user and as a uid the image does not know
    (OpenShift's way)."""
    done = containers.run("--user", user, IMAGE, timeout=JOB_TIMEOUT_SECONDS)
    assert "trained on 2 rank(s)" in done.stdout, done.stdout[-5000:]
    assert _accuracy(done.stdout) >= 0.95


@pytest.mark.parametrize("flavour", sorted(MANIFESTS))
def test_an_mpijob_runs_its_manifests_commands(containers, tmp_path, flavour):
    """A launcher and two workers as the MPI Operator starts them: the
    manifest's commands, user, SSH mount and a hostfile of the workers."""
    yaml = pytest.importorskip("yaml")
    job = yaml.safe_load(MANIFESTS[flavour].read_text())
    spec = job["spec"]
    name = job["metadata"]["name"]

    def pod(role):
        template = spec["mpiReplicaSpecs"][role]["template"]["spec"]
        user = template.get("securityContext", {}).get("runAsUser", 0)
        return template["containers"][0]["command"], user

    launcher_command, launcher_uid = pod("Launcher")
    worker_command, worker_uid = pod("Worker")
    workers = [f"{name}-worker-{i}" for i in range(spec["mpiReplicaSpecs"]["Worker"]["replicas"])]
    keys = _ssh_keys(tmp_path / "ssh", worker_uid)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{w} slots={spec['slotsPerWorker']}\n" for w in workers))
    network = containers.network()
    mount = f"{keys}:{spec['sshAuthMountPath']}:ro"
    for i, worker in enumerate(workers):
        containers.start(worker, "--network", network, "--user", str(worker_uid), "-v", mount,
                         *_cpuset(i), IMAGE, *worker_command)
    for worker in workers:
        containers.wait_for_sshd(worker)
    for worker in workers:
        containers.wait_for_name(workers[0], worker)
    done = containers.run("--name", f"{name}-launcher", "--network", network,
                          "--user", str(launcher_uid), "-v", mount,
                          "-v", f"{hostfile}:/etc/mpi/hostfile:ro", *_cpuset(0),
                          IMAGE, *launcher_command, check=False)
    assert done.returncode == 0, done.stdout[-5000:]
    assert "trained on 2 rank(s)" in done.stdout, done.stdout[-5000:]
    assert _accuracy(done.stdout) >= 0.95


def _two_hosts(containers, tmp_path):
    keys = _ssh_keys(tmp_path / "ssh", 0)
    network = containers.network()
    for i, host in enumerate(("c1", "c2")):
        containers.start(host, "--network", network, "-v", f"{keys}:/root/.ssh:ro",
                         *_cpuset(i), IMAGE, "/usr/sbin/sshd", "-De")
    for host in ("c1", "c2"):
        containers.wait_for_sshd(host)
    containers.wait_for_name("c1", "c2")


def test_horarun_in_one_container_runs_a_rank_in_the_other(containers, tmp_path):
    _two_hosts(containers, tmp_path)
    where = ("import socket, hora; hora.init(); "
             "print('rank', hora.rank(), 'of', hora.size(), 'on', socket.gethostname())")
    done = containers("exec", "c1", "horarun", "-H", "c1:1,c2:1", "-np", "2",
                      "python", "-c", where)
    assert "[0] rank 0 of 2 on c1" in done.stdout and "[1] rank 1 of 2 on c2" in done.stdout, \
        done.stdout[-5000:]
    done = containers("exec", "c1", "horarun", "-H", "c1:1,c2:1", "-np", "2",
                      "python", "examples/pytorch/train_digits.py")
    assert _accuracy(done.stdout) >= 0.95


def _kill_c2_during(containers, command, started):
    """Runs ``command`` in c1, kills c2 once a line matches ``started``, and
    returns (exit code, output, seconds from the kill to the end)."""
    job = subprocess.Popen([*containers.command, "exec", "c1", *command],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace")
    lines = []
    try:
        for line in job.stdout:
            lines.append(line)
            if re.search(started, line):
                break
        assert lines and re.search(started, lines[-1]), "".join(lines)[-5000:]
        killed = time.monotonic()
        containers("kill", "c2")
        rest, _ = job.communicate(timeout=JOB_TIMEOUT_SECONDS)
        elapsed = time.monotonic() - killed
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
    return job.returncode, "".join(lines) + rest, elapsed


def test_killing_the_second_container_stops_the_job_and_names_the_rank(containers, tmp_path):
    _two_hosts(containers, tmp_path)
    code, output, elapsed = _kill_c2_during(
        containers, ["horarun", "-H", "c1:1,c2:1", "-np", "2", "python",
                     "examples/pytorch/train_digits.py", "--epochs", "100000"], r"epoch +2 ")
    assert code != 0, output[-5000:]
    # mpirun names the lost host (in one of two messages), or else rank 0,
    # failing first, names the rank it lost.
    assert re.search(r"horarun: host c2 was lost .*, and with it rank\(s\) 1;"
                     r"|horarun: rank 1 on host c2 failed first", output), output[-5000:]
    assert elapsed < 60, f"the job took {elapsed:.0f} s to stop:\n{output[-5000:]}"
    print(f"stopped {elapsed:.1f} s after the kill: {output.strip().splitlines()[-1]}")


def test_the_cuda_image_builds_and_reports_its_cuda_and_nccl_build(engine):
    """hora:cuda compiles here without a GPU (on a base with PyPI's CUDA
    toolkit where NVIDIA's images cannot be pulled); PyTorch for CUDA, several
    GB that cannot run here, is left out, and the kernels are compiled for
    one GPU architecture (the default list takes several times as long and
    is checked by tests/test_cuda_build.py)."""
    build = subprocess.run(["bash", str(ROOT / "scripts" / "build_images.sh"), "cuda"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=BUILD_TIMEOUT_SECONDS,
                           env=dict(os.environ, HORA_IMAGE_EXTRAS="examples bench",
                                    HORA_CUDA_ARCHITECTURES="90"))
    assert build.returncode == 0, f"scripts/build_images.sh cuda failed:\n{build.stdout[-10000:]}"
    assert re.search(r"hora:cuda built in \d+ s; size \d+ MB", build.stdout), build.stdout[-3000:]
    check = engine.run("hora:cuda", "horarun", "--check-build", check=False).stdout
    assert re.search(r"\[X\] CUDA +built in: compiled with CUDA \d+\.\d+ for 90;", check), check
    assert re.search(r"\[X\] NCCL +built in: [0-9.]+ loaded", check), check


def test_with_elastic_options_the_job_goes_on_without_the_killed_container(containers, tmp_path):
    """An elastic job on both containers loses c2: mpirun cannot keep a job
    whose host's daemon it lost, so horarun launches again; c2 alone counts
    the failed starts, and after three it is left out and c1 trains on from
    the last commit."""
    _two_hosts(containers, tmp_path)
    code, output, _ = _kill_c2_during(
        containers, ["horarun", "-H", "c1:1,c2:1", "-np", "2", "--min-np", "1", "python",
                     "examples/pytorch/elastic_train_digits.py", "--epochs", "4",
                     "--step-seconds", "0.02"], r"\[0\] epoch 0:")
    assert code == 0, output[-5000:]
    assert "host c2 failed 3 launches in a row" in output, output[-5000:]
    assert "host c1 failed" not in output, output[-5000:]
    assert "[0] new world: 1 rank(s)" in output, output[-5000:]
    assert _accuracy(output) >= 0.9
