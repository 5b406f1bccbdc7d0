"""Elastic training under horarun, end to end: ranks killed (SIGKILL, an
exception, a kill while a commit is written; rank 0 too), the whole job
lost and launched again, slots added and removed by host discovery, the
reset limit and --min-np. Every recovered run must end with parameters
bit-identical to an uninterrupted run of the same world size, on every
rank (tests/elastic/train_elastic.py makes its data from (epoch, batch,
rank) only)."""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

SCRIPT = os.path.join(os.path.dirname(__file__), "elastic", "train_elastic.py")
TIMEOUT_S = 240


def _start(args, env, cwd, extra_env=None):
    environment = dict(env, **(extra_env or {}))
    environment["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return subprocess.Popen([sys.executable, "-m", "hora.runner", *args],
                            cwd=cwd, env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _finish(job):
    try:
        output, _ = job.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        job.kill()
        output, _ = job.communicate()
        pytest.fail(f"elastic job hung for {TIMEOUT_S} s:\n{output[-20000:]}")
    return job.returncode, output


def _horarun(args, env, cwd, extra_env=None):
    return _finish(_start(args, env, cwd, extra_env))


def _list_when(job, marker, hosts, listed):
    """Once ``job`` prints a line with ``marker``, the discovery script's
    ``hosts`` file lists ``listed``; the job's exit code and output."""
    lines = []
    for line in job.stdout:
        lines.append(line)
        if marker in line:
            hosts.write_text(listed + "\n")
            break
    code, rest = _finish(job)
    return code, "".join(lines) + rest


def _params(prefix, ranks):
    return [torch.load(f"{prefix}.rank{r}.pt") for r in range(ranks)]


def _assert_same(results, reference):
    for r, result in enumerate(results):
        for got, want in zip(result["params"], reference[0]["params"]):
            assert torch.equal(got, want), f"rank {r} differs from the uninterrupted run"


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Parameters of uninterrupted 2- and 3-rank runs."""
    folder = tmp_path_factory.mktemp("reference")
    out = {}
    for ranks in (2, 3):
        prefix = str(folder / f"ref{ranks}")
        code, output = _horarun(["-np", str(ranks), sys.executable, SCRIPT], _clean_env(), folder,
                                {"HORA_TEST_OUT": prefix})
        assert code == 0, output
        out[ranks] = _params(prefix, ranks)
        for result in out[ranks][1:]:
            _assert_same([result], out[ranks])
    return out


def _clean_env():
    """This environment without an enclosing MPI job's rank variables or the
    test script's own settings."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "HORA_TEST_",
                                 "HORA_ELASTIC_"))}


@pytest.fixture
def job_env():
    return _clean_env()


@pytest.mark.parametrize("ranks,fault", [
    (2, "0:1:1:6:kill"),       # SIGKILL of a rank mid-epoch
    (2, "0:0:0:9:kill"),       # SIGKILL of rank 0
    (2, "0:1:2:1:raise"),      # an exception in one rank's training code
    (3, "0:0:1:5:in-commit"),  # SIGKILL of the writing rank while a commit is written
    (2, "0:1:1:6:kill,1:0:0:0:at-start"),  # and rank 0 again while the next world forms
])
def test_a_lost_rank_resumes_from_the_last_commit(ranks, fault, references, job_env,
                                                  tmp_path):
    prefix = str(tmp_path / "out")
    code, output = _horarun(
        ["-np", str(ranks), "--min-np", str(ranks), sys.executable, SCRIPT], job_env, tmp_path,
        {"HORA_TEST_OUT": prefix, "HORA_TEST_FAULT": fault,
         "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code == 0, output
    resets = fault.count(",") + 1
    assert f"horarun: elastic reset {resets}:" in output, output
    assert f"elastic reset {resets + 1}" not in output, output
    results = _params(prefix, ranks)
    _assert_same(results, references[ranks])
    # counted by the reset callback, which each world after the first runs
    # once, from the last commit (a world lost before it committed any
    # leaves no count behind)
    assert all(result["resets"] == 1 for result in results)
    # a finished training forgets its commit: the next launch starts afresh
    assert not os.path.exists(tmp_path / "state" / "state.pkl")


@pytest.mark.parametrize("lost,transport", [(2, "mpi"), (0, "mpi"), (2, "tcp"), (0, "tcp")])
def test_survivors_go_on_in_place_from_the_step_in_flight(lost, transport, job_env, tmp_path):
    """--elastic-in-place: the survivors keep their processes (no second
    launch), re-form a world of 2 and go on from the very batch the lost
    rank interrupted, not from the last commit (batch 4); over MPI (ULFM)
    and over hora's own TCP transport."""
    prefix = str(tmp_path / "out")
    code, output = _horarun(
        ["-np", "3", "--min-np", "2", "--elastic-in-place", "--no-replace",
         "--transport", transport, sys.executable, SCRIPT], job_env,
        tmp_path, {"HORA_TEST_OUT": prefix, "HORA_TEST_FAULT": f"0:{lost}:1:6:kill",
                   "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code == 0, output
    assert f"horarun: rank {lost} on host" in output and "go on in place" in output, output
    assert "2 rank(s) go on in place (world re-formed in" in output, output
    assert "world of 2 from epoch 1 batch 6 (launch 0, resets 1)" in output, output
    assert "elastic reset" not in output, output  # nothing was launched again
    results = _params(prefix, 2)
    _assert_same(results[1:], results)
    assert all(r["size"] == 2 and r["resets"] == 1 for r in results)


def test_survivors_end_when_finalize_waits_for_the_lost_rank(job_env, tmp_path):
    """After a loss in place, MPI_Finalize waits in a PMIx fence that names
    the lost rank too, and Open MPI sometimes never lets it return. Here
    rank 0 stays busy for 8 s after training, so rank 1 waits in that
    fence: after the grace period (HORA_FINALIZE_GRACE_SECONDS, 3 s here)
    it ends without it, saying so, with the status its program ended with,
    and the job succeeds."""
    prefix = str(tmp_path / "out")
    code, output = _horarun(
        ["-np", "3", "--min-np", "2", "--elastic-in-place", "--no-replace", sys.executable,
         SCRIPT], job_env,
        tmp_path, {"HORA_TEST_OUT": prefix, "HORA_TEST_FAULT": "0:2:1:6:kill",
                   "HORA_TEST_LINGER": "0:8", "HORA_FINALIZE_GRACE_SECONDS": "3",
                   "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code == 0, output
    assert re.search(r"\[1\] \[hora rank 1\] [-0-9: .]*WARNING runtime\.cc", output), output
    assert ("MPI_Finalize has not returned "
            "after 3 s (Open MPI waits for the ranks lost earlier in this job); this process "
            "ends without it, with exit status 0" in output), output
    assert "rank 0 done" in output and "rank 1 done" in output, output
    results = _params(prefix, 2)
    _assert_same(results[1:], results)


@pytest.mark.parametrize("ranks,lost,fault,joiners,transport", [
    (3, 2, "0:2:0:6:kill", ["3"], "mpi"),
    # as many ranks as this machine has cores, bound a core each
    (2, 1, "0:1:0:6:kill", ["2"], "mpi"),
    # rank 0 lost, and then the first replacement too, right after its
    # hvd.init(): the world re-forms again and starts another
    (3, 0, "0:0:0:3:kill,0:3:0:0:joiner-at-start", ["4"], "mpi"),
    # the first replacement lost while it takes the state from rank 0
    (3, 2, "0:2:0:6:kill,0:3:0:0:joiner-in-sync", ["4"], "mpi"),
    # a survivor lost while the state goes to the replacement: the world of
    # rank 0 and the replacement re-forms and starts another
    (3, 2, "0:2:0:6:kill,0:1:0:2:in-sync", ["3", "4"], "mpi"),
    # over hora's own TCP transport, horarun starting the replacements
    (3, 2, "0:2:0:6:kill", ["3"], "tcp"),
    (3, 0, "0:0:0:3:kill,0:3:0:0:joiner-at-start", ["4"], "tcp"),
    (3, 2, "0:2:0:6:kill,0:3:0:0:joiner-in-sync", ["4"], "tcp"),
    (3, 2, "0:2:0:6:kill,0:1:0:2:in-sync", ["3", "4"], "tcp"),
])
def test_a_replacement_joins_in_place(ranks, lost, fault, joiners, transport, job_env,
                                      tmp_path):
    """--elastic-in-place without --no-replace: the survivors start a
    replacement for the lost rank, go on training while it starts, and
    take it in at a commit; the world ends as big as it began, every rank
    with the same parameters, and nothing was launched again."""
    prefix = str(tmp_path / "out")
    code, output = _horarun(
        ["-np", str(ranks), "--min-np", str(ranks - 1), "--elastic-in-place",
         "--transport", transport, sys.executable, SCRIPT], job_env,
        tmp_path, {"HORA_TEST_OUT": prefix, "HORA_TEST_FAULT": fault,
                   "HORA_TEST_STEP_SLEEP": "0.1", "HORA_TEST_END_SIZE": str(ranks),
                   "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code == 0, output
    assert f"horarun: rank {lost} on host" in output, output
    assert f"horarun: replacement process {ranks} started" in output, output
    assert f"replacement process(es) joined; {ranks} ranks go on in place" in output, output
    assert "elastic reset" not in output, output  # nothing was launched again
    results = _params(prefix, ranks)
    _assert_same(results[1:], results)
    assert all(r["size"] == ranks for r in results)
    assert [r["joiner"] for r in results if r["joiner"] is not None] == joiners, output
    if joiners != [str(ranks)]:  # a second loss during the first replacement's joining
        lost_second = "3" if joiners == ["4"] else "1"
        assert f"horarun: rank {lost_second} on host" in output, output
        assert "horarun: replacement process 4 started" in output, output
    # the replacement took the state after the survivors' reset callbacks
    assert len({r["resets"] for r in results}) == 1, [r["resets"] for r in results]


def test_losing_every_process_resumes_when_launched_again(references, job_env, tmp_path):
    # The same command line (a script of its own, so no other test shares its
    # state directory) launched twice: the first launch dies for good.
    script = str(tmp_path / "train_elastic.py")
    shutil.copy(SCRIPT, script)
    prefix = str(tmp_path / "out")
    args = ["-np", "2", "--min-np", "2", "--reset-limit", "0", sys.executable, script]
    code, output = _horarun(args, job_env, tmp_path,
                            {"HORA_TEST_OUT": prefix, "HORA_TEST_FAULT": "0:0:2:3:kill"})
    assert code != 0 and "--reset-limit 0" in output, output
    assert not os.path.exists(f"{prefix}.rank0.pt")
    code, output = _horarun(args, job_env, tmp_path, {"HORA_TEST_OUT": prefix})
    assert code == 0, output
    assert "world of 2 from epoch 2 batch 0" in output, output
    _assert_same(_params(prefix, 2), references[2])


def test_the_reset_limit_ends_a_job_that_keeps_failing(job_env, tmp_path):
    code, output = _horarun(
        ["-np", "2", "--min-np", "2", "--reset-limit", "1", sys.executable, SCRIPT], job_env,
        tmp_path, {"HORA_TEST_FAULT": "*:1:0:2:raise",
                   "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code != 0, output
    assert "horarun: elastic reset 1:" in output, output
    assert "the job has been reset 1 times (--reset-limit 1), so it stops here" in output, output


def _discovery(tmp_path, slots):
    hosts = tmp_path / "hosts"
    hosts.write_text(slots)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    return str(script), hosts


def test_too_few_slots_for_min_np_ends_the_job_with_the_reason(job_env, tmp_path):
    script, _ = _discovery(tmp_path, "localhost:1\n")
    started = time.monotonic()
    code, output = _horarun(
        ["-np", "2", "--min-np", "2", "--host-discovery-script", script, "--elastic-timeout",
         "2", sys.executable, SCRIPT], job_env, tmp_path,
        {"HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code != 0, output
    assert ("fewer than --min-np 2 slots for 2 s (--elastic-timeout): 1 slot(s) available"
            in output), output
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("first,later,ranks_after", [("localhost:1", "localhost:2", 2),
                                                     ("localhost:2", "localhost:1", 1)])
def test_discovery_grows_and_shrinks_the_world_at_a_commit(first, later, ranks_after, job_env,
                                                          tmp_path):
    script, hosts = _discovery(tmp_path, first + "\n")
    prefix = str(tmp_path / "out")
    job = _start(["-np", first.split(":")[1], "--min-np", "1", "--max-np", "2",
                  "--host-discovery-script", script, sys.executable, SCRIPT], job_env, tmp_path,
                 {"HORA_TEST_OUT": prefix, "HORA_TEST_STEP_SLEEP": "0.1",
                  "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    code, output = _list_when(job, "world of", hosts, later)
    assert code == 0, output
    change = "more slots found" if ranks_after == 2 else "fewer slots found"
    assert f"horarun: {change} (localhost:{ranks_after})" in output, output
    assert f"world of {ranks_after} from epoch" in output, output
    results = _params(prefix, ranks_after)
    assert all(result["size"] == ranks_after and result["resets"] == 1 for result in results)
    _assert_same(results[1:], results[:1])


@pytest.mark.parametrize("fault", [
    "",
    # rank 0, which heard of the slot, lost before the commit that acts on
    # it: the next rank 0 hears it from horarun again
    "0:0:0:3:kill"])
def test_discovery_grows_the_world_in_place(fault, job_env, tmp_path):
    """--elastic-in-place: more slots found start a new process, which joins
    the running world at a commit; nothing is launched again and every
    rank ends with the same parameters."""
    script, hosts = _discovery(tmp_path, "localhost:2\n")
    prefix = str(tmp_path / "out")
    job = _start(["-np", "2", "--min-np", "1", "--max-np", "3", "--elastic-in-place",
                  "--host-discovery-script", script, sys.executable, SCRIPT], job_env, tmp_path,
                 {"HORA_TEST_OUT": prefix, "HORA_TEST_STEP_SLEEP": "0.1", "HORA_TEST_END_SIZE": "3",
                  "HORA_TEST_FAULT": fault, "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    code, output = _list_when(job, "world of", hosts, "localhost:3")
    assert code == 0, output
    assert ("horarun: more slots found (localhost:3); 1 new process(es) join the world in "
            "place at a commit") in output, output
    assert "elastic reset" not in output and "world 2:" not in output, output
    results = _params(prefix, 3)
    assert all(r["size"] == 3 for r in results)
    joiners = [r["joiner"] for r in results]
    if fault:  # the lost rank's replacement, and the new slot's process
        assert "horarun: rank 0 on host" in output, output
        assert "horarun: replacement process 2 started" in output, output
        assert "horarun: new process 3 started" in output, output
        assert "process(es) joined; 3 ranks go on in place" in output, output
        assert joiners[0] is None and sorted(joiners[1:]) == ["2", "3"], output
    else:
        assert "horarun: new process 2 started" in output, output
        assert "new process(es) joined; 3 ranks go on in place" in output, output
        assert joiners == [None, None, "2"]
    _assert_same(results[1:], results)


@pytest.mark.parametrize("transport", ["mpi", "tcp"])
def test_fewer_slots_make_a_rank_leave_and_the_others_go_on_in_place(transport, job_env,
                                                                     tmp_path):
    """--elastic-in-place: host discovery lists one slot fewer while the
    three ranks train. At the next commit the highest rank leaves the job
    (its process ends well), the other two form a world of their own and
    go on from that commit in their processes: nothing launched again, no
    replacement started, both end with the same parameters."""
    script, hosts = _discovery(tmp_path, "localhost:3\n")
    prefix = str(tmp_path / "out")
    job = _start(["-np", "3", "--min-np", "1", "--elastic-in-place", "--transport", transport,
                  "--host-discovery-script", script, sys.executable, SCRIPT], job_env, tmp_path,
                 {"HORA_TEST_OUT": prefix, "HORA_TEST_STEP_SLEEP": "0.15",
                  "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    code, output = _list_when(job, "world of 3", hosts, "localhost:2")
    assert code == 0, output
    assert ("horarun: fewer slots found (localhost:2); the ranks beyond the slots left there "
            "leave at the next commit, and 2 rank(s) go on in place") in output, output
    assert "[2] hora.elastic: rank 2 leaves the job" in output, output
    assert "hora.elastic: rank(s) 2 left the job" in output, output
    assert "2 rank(s) go on in place (world re-formed in" in output, output
    assert "world of 2 from epoch" in output and "(launch 0, resets 1)" in output, output
    assert "elastic reset" not in output and "world 2:" not in output, output
    assert "started on host" not in output, output  # no replacement
    assert not os.path.exists(f"{prefix}.rank2.pt"), output
    results = _params(prefix, 2)
    assert all(r["size"] == 2 and r["resets"] == 1 and r["joiner"] is None for r in results)
    _assert_same(results[1:], results)


@pytest.mark.parametrize("framework", ["pytorch", "keras"])
def test_the_elastic_example_trains(framework, job_env, tmp_path):
    if framework == "keras":
        pytest.importorskip("tensorflow")
    example = os.path.join(os.path.dirname(__file__), "..", "examples", framework,
                           "elastic_train_digits.py")
    code, output = _horarun(
        ["-np", "2", "--min-np", "1", sys.executable, example, "--epochs", "3"], job_env,
        tmp_path, {"HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code == 0, output
    accuracy = float(output.rsplit("final test accuracy ", 1)[1].split()[0])
    assert accuracy > 0.8, output


def _training_processes(script):
    """PIDs of the processes running ``python script`` (not horarun's rank
    wrappers, whose command line names the script too)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except (OSError, ValueError):
            continue
        if len(args) > 1 and args[1] == script.encode():
            pids.append(int(entry))
    return pids


def _signal_one_rank_once(job, script, started, signum):
    """Sends ``signum`` to the last of the job's training processes a second
    after a line of output contains ``started``; the job's output once it
    ended."""
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(job.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + TIMEOUT_S
    while not any(started in line for line in lines) and time.monotonic() < deadline:
        if job.poll() is not None:
            break
        time.sleep(0.1)
    time.sleep(1.0)
    victims = _training_processes(script)
    assert len(victims) == 3, "".join(lines)
    os.kill(victims[-1], signum)
    try:
        job.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        job.kill()
    reader.join(10)
    return "".join(lines)


def test_a_stopped_rank_is_killed_and_replaced_in_place(job_env, tmp_path):
    """A rank stopped with SIGSTOP would hold the others up for ever; in
    place its wrapper kills it after HORA_ELASTIC_STOPPED_SECONDS and the
    others go on without it, and replace it."""
    prefix = str(tmp_path / "out")
    job = _start(["-np", "3", "--min-np", "2", "--elastic-in-place", sys.executable, SCRIPT],
                 job_env, tmp_path,
                 {"HORA_TEST_OUT": prefix, "HORA_TEST_STEP_SLEEP": "0.1", "HORA_TEST_END_SIZE": "3",
                  "HORA_ELASTIC_STOPPED_SECONDS": "2",
                  "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    output = _signal_one_rank_once(job, SCRIPT, "world of 3", signal.SIGSTOP)
    assert job.returncode == 0, output
    assert "has been stopped for 2 s; killing it so that the others go on in place" in output, \
        output
    assert "go on in place" in output, output
    assert "elastic reset" not in output, output
    results = _params(prefix, 3)
    _assert_same(results[1:], results)
    assert all(r["size"] == 3 for r in results)


@pytest.mark.parametrize("framework", ["pytorch", "keras"])
def test_the_elastic_example_survives_a_sigkill_in_place(framework, job_env, tmp_path):
    """The examples as they are, under --elastic-in-place: one of their
    processes is SIGKILLed once training is under way; the others go on in
    place (a replacement may join) and the training ends as well as without
    the kill."""
    if framework == "keras":
        pytest.importorskip("tensorflow")
    example = os.path.join(os.path.dirname(__file__), "..", "examples", framework,
                           "elastic_train_digits.py")
    job = _start(["-np", "3", "--min-np", "2", "--elastic-in-place", sys.executable, example,
                  "--epochs", "6"], job_env, tmp_path,
                 {"HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    output = _signal_one_rank_once(job, example, "epoch", signal.SIGKILL)
    assert job.returncode == 0, output
    assert "go on in place" in output, output
    assert "elastic reset" not in output, output  # nothing was launched again
    assert "final test accuracy " in output, output
    accuracy = float(output.rsplit("final test accuracy ", 1)[1].split()[0])
    assert accuracy > 0.8, output


def test_keras_fit_resumes_from_the_last_epoch_commit(job_env, tmp_path):
    pytest.importorskip("tensorflow")
    import numpy as np
    script = os.path.join(os.path.dirname(__file__), "elastic", "train_keras_elastic.py")
    runs = {}
    for label, fault in (("ref", ""), ("kill", "0:1:2:3")):
        prefix = str(tmp_path / label)
        code, output = _horarun(["-np", "2", "--min-np", "2", sys.executable, script], job_env,
                                tmp_path, {"HORA_TEST_OUT": prefix, "HORA_TEST_FAULT": fault,
                                           "HORA_ELASTIC_STATE_DIR": str(tmp_path / label)})
        assert code == 0, output
        runs[label] = [np.load(f"{prefix}.rank{r}.npz") for r in range(2)]
    assert "keras world of 2 from epoch 2" in output, output
    reference = runs["ref"][0]
    for weights in runs["ref"] + runs["kill"]:
        assert all(np.array_equal(weights[k], reference[k]) for k in reference.files)


SHARDED = os.path.join(os.path.dirname(__file__), "elastic", "train_sharded_elastic.py")


@pytest.fixture(scope="module")
def sharded_references(tmp_path_factory):
    """The uninterrupted 4-rank run's output prefix for each sharding stage,
    run once per stage for the whole module."""
    folder = tmp_path_factory.mktemp("sharded-reference")
    done = {}

    def reference(sharding):
        if sharding not in done:
            prefix = str(folder / sharding)
            code, output = _horarun(["-np", "4", sys.executable, SHARDED], _clean_env(), folder,
                                    {"HORA_TEST_OUT": prefix, "HORA_TEST_SHARDING": sharding})
            assert code == 0, output
            done[sharding] = prefix
        return done[sharding]
    return reference


def _sharded_in_place(job_env, tmp_path, prefix, extra):
    """4 ranks of the sharded script under --elastic-in-place (2 to 4),
    writing to ``prefix``; a smaller world waits for replacements before
    the last epoch."""
    return _horarun(["-np", "4", "--min-np", "2", "--max-np", "4", "--elastic-in-place",
                     sys.executable, SHARDED], job_env, tmp_path,
                    {"HORA_TEST_OUT": prefix, "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state"),
                     "HORA_TEST_AWAIT_SIZE": "4", **extra})


@pytest.mark.parametrize("sharding", ["gradients", "parameters"])
def test_sharded_state_survives_a_world_of_another_size(sharding, sharded_references, job_env,
                                                         tmp_path):
    """4 ranks, one SIGKILLed (the next world has 3), then a slot comes back
    (4 again): each new world merges the shards every rank of the last
    commit wrote and re-cuts them (with sharding="parameters" the model's
    weights too, committed whole), and the run ends like an uninterrupted
    4-rank run (the same averaged gradients every step; sums of 3 ranks
    add in another order, so not bit for bit)."""
    job_env = dict(job_env, HORA_TEST_SHARDING=sharding)
    reference = sharded_references(sharding)
    script, hosts = _discovery(tmp_path, "localhost:4\n")
    prefix = str(tmp_path / "out")
    code, output = _horarun(
        ["-np", "4", "--min-np", "2", "--max-np", "4", "--host-discovery-script", script,
         sys.executable, SHARDED], job_env, tmp_path,
        {"HORA_TEST_OUT": prefix, "HORA_TEST_HOSTS": str(hosts), "HORA_TEST_SHRINK": "1",
         "HORA_TEST_STEP_SLEEP": "0.15", "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state")})
    assert code == 0, output
    worlds = [line.split("sharded world of ", 1)[1] for line in output.splitlines()
              if "sharded world of " in line]
    assert [w.split()[0] for w in worlds] == ["4", "3", "4"], output
    assert "from epoch 0 batch 4 (launch 1)" in worlds[1], output
    expected = torch.load(f"{reference}.rank0.pt", weights_only=False)
    largest = 0.0
    for r in range(4):
        got = torch.load(f"{prefix}.rank{r}.pt", weights_only=False)
        assert got["size"] == 4
        for a, b in zip(got["params"], expected["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            largest = max(largest, float(((a - b).abs() / b.abs().clamp_min(1e-3)).max()))
        for number, entry in expected["optimizer"]["state"].items():
            for key, value in entry.items():
                torch.testing.assert_close(got["optimizer"]["state"][number][key], value,
                                           rtol=1e-4, atol=1e-7)
    assert not os.listdir(tmp_path / "state"), "a finished run forgets its commit and parts"
    print(f"largest relative difference to the uninterrupted run: {largest:.3g}")


def _assert_like_sharded_reference(prefix, reference, ranks):
    expected = torch.load(f"{reference}.rank0.pt", weights_only=False)
    for r in range(ranks):
        got = torch.load(f"{prefix}.rank{r}.pt", weights_only=False)
        assert got["size"] == ranks
        for a, b in zip(got["params"], expected["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        for number, entry in expected["optimizer"]["state"].items():
            for key, value in entry.items():
                torch.testing.assert_close(got["optimizer"]["state"][number][key], value,
                                           rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("sharding,killed", [("optimizer_state", 3), ("gradients", 0),
                                             ("parameters", 1)])
def test_sharded_state_recovers_in_place_from_the_buddy_copies(sharding, killed, sharded_references,
                                                                job_env, tmp_path):
    """4 ranks in place, one SIGKILLed (rank 0 too) before epoch 0 batch 5:
    the other 3 keep their processes, go back to the last commit (epoch 0
    batch 4) from their own parts and the buddy copy of the lost rank's,
    cut it for 3 ranks (stage 3: the weights too), and a replacement joins
    later and gets its share of the state; no relaunch, and the run ends
    like the uninterrupted 4-rank run."""
    job_env = dict(job_env, HORA_TEST_SHARDING=sharding)
    reference = sharded_references(sharding)
    prefix = str(tmp_path / "out")
    code, output = _sharded_in_place(job_env, tmp_path, prefix, {
        "HORA_TEST_KILL": str(killed), "HORA_TEST_STEP_SLEEP": "0.15"})
    assert code == 0, output
    worlds = [line.split("sharded world of ", 1)[1] for line in output.splitlines()
              if "sharded world of " in line]
    assert [w.split()[0] for w in worlds] == ["4", "3", "4"], output
    assert "from epoch 0 batch 4 (launch 0)" in worlds[1], output
    assert all(w.endswith("(launch 0)") for w in worlds), output
    assert "back to commit 2, its shards cut again for 3 rank(s)" in output, output
    assert "replacement process(es) joined; 4 ranks" in output, output
    _assert_like_sharded_reference(prefix, reference, 4)
    # the reset callbacks ran at the loss and at the join, and what they
    # changed reached the replacement too (which runs none itself)
    for r in range(4):
        got = torch.load(f"{prefix}.rank{r}.pt", weights_only=False)
        assert got["resets_seen"] == 2, (r, got["resets_seen"])
        assert [g["resets_seen"] for g in got["optimizer"]["param_groups"]] == [2], r


def _sharded_discovered(sharding, ranks, worlds, job_env, tmp_path, prefix, extra):
    """The sharded script in place, ``ranks`` slots listed by host discovery
    at first (2 to 4), with ``extra`` in its environment: its output, once
    it finished well after forming worlds of the sizes ``worlds`` (text),
    never launched again."""
    script, hosts = _discovery(tmp_path, f"localhost:{ranks}\n")
    code, output = _horarun(
        ["-np", str(ranks), "--min-np", "2", "--max-np", "4", "--elastic-in-place",
         "--host-discovery-script", script, sys.executable, SHARDED],
        dict(job_env, HORA_TEST_SHARDING=sharding), tmp_path,
        {"HORA_TEST_OUT": prefix, "HORA_TEST_HOSTS": str(hosts), "HORA_TEST_STEP_SLEEP": "0.3",
         "HORA_ELASTIC_STATE_DIR": str(tmp_path / "state"), **extra})
    assert code == 0, output
    formed = [line.split("sharded world of ", 1)[1] for line in output.splitlines()
              if "sharded world of " in line]
    assert [w.split()[0] for w in formed] == worlds, output
    assert all(w.endswith("(launch 0)") for w in formed), output
    return output


@pytest.mark.parametrize("sharding", ["gradients", "parameters"])
def test_sharded_job_grows_in_place_from_host_discovery(sharding, sharded_references, job_env,
                                                        tmp_path):
    """3 ranks in place; host discovery then lists a fourth slot: the new
    process builds its sharded optimizer before it joins (for the future
    world, no collectives), joins at a commit, and the 4 ranks cut the
    commit just made for 4 (stage 3: the weights too). No relaunch; the
    run ends like an uninterrupted 4-rank run."""
    reference = sharded_references(sharding)
    prefix = str(tmp_path / "out")
    output = _sharded_discovered(sharding, 3, ["3", "4"], job_env, tmp_path, prefix,
                                 {"HORA_TEST_GROW": "1", "HORA_TEST_AWAIT_SIZE": "4"})
    assert "horarun: new process 3 started" in output, output
    assert "new process(es) joined; 4 ranks" in output, output
    _assert_like_sharded_reference(prefix, reference, 4)


@pytest.mark.parametrize("sharding", ["optimizer_state", "parameters"])
def test_sharded_ranks_leave_in_place_when_their_slots_go(sharding, sharded_references, job_env,
                                                          tmp_path):
    """4 ranks in place; host discovery then lists 2 slots: ranks 2 and 3
    (neighbours, so the buddy copy of rank 2's part leaves too) hand their
    parts to the ranks that stay and leave at the next commit; the other 2
    cut that commit for 2 (stage 3: the weights too) and go on in their
    processes. No relaunch, nothing lost: the run ends like the
    uninterrupted 4-rank run."""
    reference = sharded_references(sharding)
    prefix = str(tmp_path / "out")
    output = _sharded_discovered(sharding, 4, ["4", "2"], job_env, tmp_path, prefix,
                                 {"HORA_TEST_LEAVE": "2"})
    assert "hora.elastic: rank(s) 2, 3 left the job" in output, output
    assert "started on host" not in output, output
    assert not os.path.exists(f"{prefix}.rank2.pt"), output
    _assert_like_sharded_reference(prefix, reference, 2)


def test_sharded_state_relaunches_when_a_part_and_its_copy_are_both_lost(sharded_references,
                                                                          job_env, tmp_path):
    """Ranks 2 and 3 of 4 SIGKILLed together: rank 2's part of the last
    commit lived on rank 2 and on rank 3 (its buddy), so the two ranks left
    hold no commit whole; they say so and leave, and horarun relaunches
    from the commit's parts on disk. The run ends like the uninterrupted
    one."""
    job_env = dict(job_env, HORA_TEST_SHARDING="gradients")
    reference = sharded_references("gradients")
    prefix = str(tmp_path / "out")
    code, output = _sharded_in_place(job_env, tmp_path, prefix, {
        "HORA_TEST_KILL": "2,3", "HORA_TEST_STEP_SLEEP": "0.15"})
    assert code == 0, output
    assert "no commit is held whole by the ranks left" in output, output
    worlds = [line.split("sharded world of ", 1)[1] for line in output.splitlines()
              if "sharded world of " in line]
    assert worlds[-1].startswith("4 from epoch 0 batch 4 (launch 1)"), output
    _assert_like_sharded_reference(prefix, reference, 4)


@pytest.mark.parametrize("fault,back_to,worlds", [
    ({"HORA_TEST_KILL_IN_COPY": "1"}, "epoch 0 batch 2", ["4", "3", "4"]),
    ({"HORA_TEST_KILL": "3", "HORA_TEST_KILL_IN_RESTORE": "1"}, "epoch 0 batch 4",
     ["4", "2", "4"])])
def test_sharded_state_in_place_survives_losses_inside_the_recovery(fault, back_to, worlds,
                                                                     sharded_references, job_env,
                                                                     tmp_path):
    """A rank SIGKILLed as it starts copying its part of commit 2 to its
    neighbour: no survivor finished that copy, so commit 2 is not whole and
    the 3 survivors go back to commit 1 (epoch 0 batch 2). And a second
    loss while the survivors of a first one restore: the 2 left still hold
    every part of commit 2 (rank 1's part on rank 2, rank 3's on rank 0),
    go back to it, and 2 replacements join. Both end like the uninterrupted
    run."""
    job_env = dict(job_env, HORA_TEST_SHARDING="gradients")
    reference = sharded_references("gradients")
    prefix = str(tmp_path / "out")
    code, output = _sharded_in_place(job_env, tmp_path, prefix,
                                     {"HORA_TEST_STEP_SLEEP": "0.3", **fault})
    assert code == 0, output
    seen = [line.split("sharded world of ", 1)[1] for line in output.splitlines()
            if "sharded world of " in line]
    assert [w.split()[0] for w in seen] == worlds, output
    assert seen[1].startswith(f"{worlds[1]} from {back_to} (launch 0)"), output
    assert all(w.endswith("(launch 0)") for w in seen), output
    _assert_like_sharded_reference(prefix, reference, 4)
