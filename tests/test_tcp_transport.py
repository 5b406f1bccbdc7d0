"""hora's own TCP transport, with processes started here without MPI (as
horarun's own launch does) and the launcher's rendezvous
(hora.runner.rendezvous) deciding each world: a world forms at 1, 2 and 3
processes; survivors of a SIGKILL (rank 0's included, and a second loss
after the first) form the next world in place, in their own processes;
a stopped process is excluded and ended."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from hora.runner.rendezvous import Rendezvous

WORKER = os.path.join(os.path.dirname(__file__), "tcp", "worker.py")


def run_job(job_env, num_proc, faults="", steps=8, form_timeout=10.0, extra_env=None,
            timeout=120):
    """Runs the worker in ``num_proc`` processes; returns each one's events
    and exit code, and what the rendezvous ended."""
    ended = []
    procs = {}

    def end(process_id, why):
        ended.append(process_id)
        procs[process_id].kill()

    rendezvous = Rendezvous(list(range(num_proc)), host="127.0.0.1", form_timeout=form_timeout,
                            on_lost=end, log=lambda text: None)
    try:
        for i in range(num_proc):
            env = dict(job_env, **rendezvous.env(i, "127.0.0.1"), TCP_FAULTS=faults,
                       TCP_STEPS=str(steps), **(extra_env or {}))
            for name in ("HORA_RANK", "HORA_SIZE", "OMPI_COMM_WORLD_RANK"):
                env.pop(name, None)
            procs[i] = subprocess.Popen([sys.executable, WORKER], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + timeout
        for i, proc in procs.items():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other in procs.values():
                    other.kill()
                pytest.fail(f"process {i} did not end within {timeout} s")
            if proc.returncode != 0:
                rendezvous.lost(i, f"exit code {proc.returncode}")
        results = {}
        for i, proc in procs.items():
            out, err = proc.communicate()
            events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
            results[i] = (proc.returncode, events, err)
        return results, ended
    finally:
        rendezvous.close()


def last(events, kind):
    found = [e for e in events if e["event"] == kind]
    return found[-1] if found else None


@pytest.mark.parametrize("num_proc", [1, 2, 3])
def test_a_world_forms_over_tcp_without_mpi(job_env, num_proc):
    results, _ = run_job(job_env, num_proc, steps=4)
    for i, (code, events, err) in results.items():
        assert code == 0, err
        init, done = last(events, "init"), last(events, "done")
        assert (init["rank"], init["size"]) == (i, num_proc)
        assert done["ids"] == list(range(num_proc))


def test_survivors_form_the_next_world_in_place(job_env):
    # Process 1 dies at step 3; then rank 0 (process 0) at step 6, during
    # the world the first loss left.
    results, _ = run_job(job_env, 3, faults="1:kill@3,0:kill@6", steps=9)
    assert results[1][0] == -signal.SIGKILL
    assert results[0][0] == -signal.SIGKILL
    code, events, err = results[2]
    assert code == 0, err
    init = last(events, "init")
    reforms = [e for e in events if e["event"] == "reformed"]
    assert [(e["rank"], e["size"]) for e in reforms] == [(1, 2), (0, 1)], events
    assert all(e["pid"] == init["pid"] for e in events)  # the same process throughout
    assert "rank 1" in reforms[0]["error"] or "revoked" in reforms[0]["error"]
    assert all(e["seconds"] < 1.0 for e in reforms), reforms
    assert last(events, "done")["ids"] == [2]
    # process 0's view of the first loss: the same world, then its own end
    zero = results[0][1]
    assert [(e["rank"], e["size"]) for e in zero if e["event"] == "reformed"] == [(0, 2)]


def test_a_stopped_process_is_excluded_and_ended(job_env):
    # Process 2 stops itself (SIGSTOP) at step 2: the survivors' heartbeat
    # gives up on it after 1 s, and the rendezvous excludes it after 2 s.
    results, ended = run_job(job_env, 3, faults="2:stop@2", steps=5, form_timeout=2.0,
                             extra_env={"HORA_STALL_SHUTDOWN_TIME_SECONDS": "1"})
    assert ended == [2]
    assert results[2][0] == -signal.SIGKILL
    for i in (0, 1):
        code, events, err = results[i]
        assert code == 0, err
        assert [(e["rank"], e["size"]) for e in events if e["event"] == "reformed"] == [(i, 2)]
        assert last(events, "done")["ids"] == [0, 1]


def test_processes_leave_and_the_others_go_on_in_place(job_env):
    # At step 2 processes 1 and 3 leave together (their hosts removed); at
    # step 5 process 0, rank 0 then, leaves too. Nobody is lost: the
    # others' next worlds form in their processes, and the leavers end well.
    results, ended = run_job(job_env, 4, faults="1:leave@2,3:leave@2,0:leave@5", steps=8)
    assert ended == []
    for i in (0, 1, 3):
        code, events, err = results[i]
        assert code == 0, err
        assert last(events, "left") is not None, events
    for i, first_rank in ((2, 2),):
        code, events, err = results[i]
        assert code == 0, err
        assert last(events, "init")["rank"] == first_rank
        excluded = [e for e in events if e["event"] == "excluded"]
        assert [(e["rank"], e["size"], e["leaving"]) for e in excluded] == [
            (1, 2, [1, 3]), (0, 1, [0])], events
        assert all(e["pid"] == events[0]["pid"] for e in events)
        assert all(e["seconds"] < 1.0 for e in excluded), excluded
        assert last(events, "done")["ids"] == [2]
        assert not [e for e in events if e["event"] in ("reformed", "wrong")], events
    # process 0 saw the first exclusion from the inside
    assert [(e["rank"], e["size"]) for e in results[0][1] if e["event"] == "excluded"] == [(0, 2)]


def test_the_rendezvous_refuses_a_stranger():
    import socket
    rendezvous = Rendezvous([0], host="127.0.0.1", log=lambda text: None)
    try:
        with socket.create_connection(("127.0.0.1", rendezvous.port), timeout=5) as conn:
            conn.sendall(f"HELLO {rendezvous.cookie + 1} 0\n".encode())
            assert conn.recv(100) == b""  # closed on it
        with socket.create_connection(("127.0.0.1", rendezvous.port), timeout=5) as conn:
            conn.sendall(f"HELLO {rendezvous.cookie} 7\n".encode())  # no process 7
            assert conn.recv(100) == b""
        assert rendezvous.alive() == [0]
    finally:
        rendezvous.close()
