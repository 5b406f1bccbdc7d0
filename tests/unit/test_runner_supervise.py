"""horarun's job supervision, driven by stand-in mpirun processes that print
the ranks' markers themselves (no MPI involved)."""
import io
import os
import signal
import sys
import textwrap
import threading
import time

from hora.runner import markers, supervise


def fake_mpirun(body):
    """A command that behaves like mpirun running ranks: ``emit(event, rank,
    outcome)`` prints a marker, everything else is plain Python."""
    prelude = textwrap.dedent(f"""
        import os, signal, sys, time
        def emit(event, rank, outcome="", at=None):
            fields = [event, str(rank), "host" + str(rank)]
            if event == "exited":
                fields += [outcome, repr(time.time() if at is None else at)]
            elif event == "raised":
                fields += [repr(time.time() if at is None else at), outcome or "own"]
            elif outcome:  # started: new / replacement
                fields.append(outcome)
            line = {markers._LEAD!r} + " ".join(fields).encode() + b"\\n"
            sys.stdout.buffer.write(line); sys.stdout.buffer.flush()
    """)
    return [sys.executable, "-c", prelude + textwrap.dedent(body)]


def run(body, num_proc=2, start_timeout=30, in_place=False):
    out, err, log = io.BytesIO(), io.BytesIO(), []
    began = time.monotonic()
    outcome = supervise.run(fake_mpirun(body), num_proc, start_timeout, out, err, log.append,
                            in_place=in_place)
    return outcome, out.getvalue(), err.getvalue(), log, time.monotonic() - began


def test_clean_job_passes_output_and_hides_markers():
    outcome, out, err, log, _ = run("""
        emit("started", 0); emit("started", 1)
        print("[0] hello", flush=True); sys.stderr.write("[1] warn\\n")
        emit("exited", 0, "code=0"); emit("exited", 1, "code=0")
    """)
    assert outcome.code == 0 and outcome.message == ""
    assert out == b"[0] hello\n" and err == b"[1] warn\n"
    assert outcome.started == {0, 1} and log == []


def test_first_failure_is_named_and_its_code_returned():
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        emit("exited", 1, "code=3"); emit("exited", 0, "signal=SIGTERM")
        sys.exit(3)
    """)
    assert outcome.code == 3
    assert outcome.message == ("horarun: rank 1 on host host1 failed first (exit code 3); the job "
                               "was stopped")


def test_earliest_failure_wins_over_the_first_to_arrive():
    # Rank 0 reports first, but rank 1 died earlier (rank 0 merely lost it).
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        now = time.time()
        emit("exited", 0, "code=14", at=now); emit("exited", 1, "signal=SIGKILL", at=now - 0.2)
        sys.exit(14)
    """)
    assert outcome.code == 128 + signal.SIGKILL
    assert outcome.first_failure.rank == 1


def test_the_rank_that_raised_first_is_named_though_a_peer_exited_first():
    # Rank 1 raised; rank 0 then failed because rank 1 shut hora down, and
    # exited first while rank 1 was still tearing down (stopped by horarun).
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        now = time.time()
        emit("raised", 1, at=now - 1.0); emit("raised", 0, "peer", at=now - 1.5)
        emit("exited", 0, "code=1", at=now)
        sys.exit(1)
    """)
    assert outcome.code == 1
    assert outcome.message == ("horarun: rank 1 on host host1 failed first (exit code 1); the job "
                               "was stopped")


def test_a_killed_rank_is_named_though_its_peers_raised():
    # Rank 1 was killed; rank 0 then raised (lost connection) and exited.
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        now = time.time()
        emit("exited", 1, "signal=SIGKILL", at=now - 1.0)
        emit("raised", 0, "peer", at=now - 1.5); emit("exited", 0, "code=1", at=now)
        sys.exit(1)
    """)
    assert outcome.first_failure.rank == 1
    assert outcome.code == 128 + signal.SIGKILL


def test_a_stopped_rank_named_by_its_peers_is_blamed_though_it_ended_last():
    # Rank 1 was stopped; ranks 0 and 2 raised errors naming it and exited;
    # only then did the launcher kill rank 1.
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1); emit("started", 2)
        now = time.time()
        emit("raised", 0, "peer=1", at=now - 2.0); emit("raised", 2, "peer=1", at=now - 1.9)
        emit("exited", 0, "code=1", at=now - 1.5); emit("exited", 2, "code=1", at=now - 1.4)
        emit("exited", 1, "signal=SIGKILL", at=now)
        sys.exit(1)
    """, num_proc=3)
    assert outcome.first_failure.rank == 1


def test_a_stopped_rank_is_blamed_though_its_end_was_never_reported():
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        now = time.time()
        emit("raised", 1, "peer=0", at=now - 1.0); emit("exited", 1, "code=1", at=now)
        sys.exit(1)
    """)
    assert outcome.first_failure.rank == 0 and outcome.code == 1
    assert outcome.message == ("horarun: rank 0 on host host0 failed first (named by rank 1 as "
                               "lost or stopped); the job was stopped")


def test_a_raise_that_did_not_end_the_job_is_no_failure():
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        emit("raised", 1)
        emit("exited", 0, "code=0"); emit("exited", 1, "code=0")
    """)
    assert outcome.code == 0 and outcome.message == ""


def test_killed_rank_gives_128_plus_signal():
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        emit("exited", 0, "signal=SIGKILL"); sys.exit(137)
    """)
    assert outcome.code == 128 + signal.SIGKILL
    assert "rank 0 on host host0 failed first (killed by SIGKILL)" in outcome.message


def test_mpirun_that_lingers_after_a_failure_is_stopped():
    # A stand-in that ignores SIGTERM: horarun must still end it, by SIGKILL.
    outcome, _, _, _, seconds = run("""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        emit("started", 0); emit("started", 1); emit("exited", 1, "code=2")
        time.sleep(60)
    """)
    assert outcome.code == 2
    assert seconds < supervise.FAIL_FAST_GRACE_S + supervise.KILL_GRACE_S + 3


def test_start_timeout_names_the_missing_ranks():
    outcome, _, _, log, seconds = run("""
        emit("started", 0); emit("started", 2)
        time.sleep(60)
    """, num_proc=4, start_timeout=1)
    assert outcome.code != 0
    assert seconds < 10
    assert any("only 2 of 4 ranks started within 1 s" in line and "missing: 1, 3" in line
               for line in log), log


def test_exit_code_of_mpirun_without_markers():
    outcome, *_ = run("sys.stderr.write('mpirun: not enough slots\\n'); sys.exit(5)")
    assert outcome.code == 5 and outcome.message == "horarun: job failed with exit code 5"


def test_signal_stops_the_job():
    # Deliver SIGTERM to this process while supervise.run waits: it must
    # pass the stop on, and report it.
    timer = threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        outcome, _, _, log, seconds = run("""
            emit("started", 0); emit("started", 1)
            time.sleep(60)
        """)
    finally:
        timer.cancel()
    assert outcome.code == 128 + signal.SIGTERM
    assert outcome.message == "horarun: job stopped by SIGTERM"
    assert seconds < 10
    assert signal.getsignal(signal.SIGTERM) is not None


def test_a_transient_launcher_failure_before_any_rank_started_is_flagged():
    outcome, _, err, _, _ = run("""
        sys.stderr.write("The PMIx server's listener thread failed to start. We cannot\\n")
        sys.exit(213)
    """)
    assert outcome.code == 213 and outcome.transient_start_failure
    assert b"listener thread failed" in err  # the user still sees mpirun's message


def test_the_same_message_after_a_rank_started_is_not_retried():
    outcome, _, _, _, _ = run("""
        emit("started", 0)
        sys.stderr.write("The PMIx server's listener thread failed to start. We cannot\\n")
        sys.exit(213)
    """)
    assert outcome.code == 213 and not outcome.transient_start_failure


def test_a_clean_mpirun_exit_with_ranks_unaccounted_for_is_a_failure():
    from hora.runner import supervise
    outcome = supervise._outcome(0, 3, {0, 1, 2}, None, None, False, 60, exited={0, 2})
    assert outcome.code == 1
    assert "rank(s) 1 never reported how they ended" in outcome.message
    assert supervise._outcome(0, 2, {0, 1}, None, None, False, 60, exited={0, 1}).code == 0


def test_a_host_whose_daemon_mpirun_lost_is_named_with_its_ranks():
    # Open MPI 5's words when a host's container is killed; host1 runs rank 1
    # (the stand-in names host "host<rank>"), here fully qualified by mpirun.
    outcome, _, err, _, _ = run("""
        emit("started", 0); emit("started", 1)
        sys.stderr.write("PRTE has lost communication with a remote daemon.\\n\\n"
                         "  HNP daemon   : [prterun-c1-13@0,0] on node host0\\n"
                         "  Remote daemon: [prterun-c1-13@0,1] on node host1.cluster.local\\n")
        sys.exit(1)
    """)
    assert outcome.code == 1 and b"Remote daemon" in err
    assert outcome.message == ("horarun: host host1.cluster.local was lost (mpirun lost its "
                               "daemon there), and with it rank(s) 1; the job was stopped")


def test_a_lost_host_is_the_cause_though_a_rank_left_behind_failed_first():
    # Rank 0 loses its peer (an error of hora's, not its own) and exits
    # before mpirun reports that rank 1's host is gone.
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        emit("raised", 0, "peer"); emit("exited", 0, "code=1")
        sys.stderr.write("  Remote daemon: [prterun-x@0,1] on node host1\\n")
        sys.exit(1)
    """)
    assert outcome.code == 1 and outcome.first_failure is None
    assert outcome.message == ("horarun: host host1 was lost (mpirun lost its daemon there), "
                               "and with it rank(s) 1; the job was stopped")


def test_a_host_whose_ssh_session_ended_is_named_as_lost():
    # Open MPI 5 when the ssh session to a host ends before its daemon is
    # missed: the start-up failure message, naming the host as "Remote host".
    banner = ("  Local host:    host0\\n  Remote host:   host1\\n  Daemon exit status: 255\\n")
    outcome, *_ = run(f"""
        emit("started", 0); emit("started", 1)
        sys.stderr.write("A daemon failed to report back after being spawned. This could\\n"
                         "{banner}------\\n")
        sys.exit(255)
    """)
    assert outcome.code == 255
    assert outcome.message == ("horarun: host host1 was lost (mpirun lost its daemon there), "
                               "and with it rank(s) 1; the job was stopped")
    # Before any rank started there: the host could not be reached.
    outcome, *_ = run(f"""
        emit("started", 0)
        sys.stderr.write("A daemon failed to report back after being spawned. This could\\n"
                         "{banner}------\\n")
        sys.exit(255)
    """)
    assert outcome.message.startswith("horarun: mpirun lost its daemon on host host1 (the host "
                                      "cannot be reached")


def test_a_daemon_lost_after_every_rank_ended_well_is_no_failure():
    # mpirun's own shutdown, seen after a job grew onto a host in place
    outcome = supervise._outcome(213, 2, {0, 1}, None, None, False, 60, exited={0, 1},
                                 lost=("ns-a", []))
    assert outcome.code == 0 and "every rank ended well" in outcome.message
    # a rank that never reported its end: the host was lost with it
    outcome = supervise._outcome(213, 2, {0, 1}, None, None, False, 60, exited={0},
                                 lost=("ns-a", [1]))
    assert outcome.code == 213 and outcome.lost_host == "ns-a"


def test_remote_host_lines_of_other_messages_name_no_lost_host():
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        sys.stderr.write("Open MPI failed to TCP connect to a peer MPI process.\\n"
                         "  Local host: host0\\n  Remote host: host1\\n")
        sys.exit(5)
    """)
    assert outcome.message == "horarun: job failed with exit code 5"


def test_an_exception_of_a_ranks_own_is_the_cause_though_a_host_was_lost():
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        emit("raised", 0, "own"); emit("exited", 0, "code=1")
        sys.stderr.write("  Remote daemon: [prterun-x@0,1] on node host1\\n")
        sys.exit(1)
    """)
    assert outcome.first_failure.rank == 0
    assert outcome.message.startswith("horarun: rank 0 on host host0 failed first")


def test_in_place_a_job_ends_well_when_every_rank_and_replacement_left_ends_well():
    body = """
        emit("started", 0); emit("started", 1)
        emit("exited", 1, "signal=SIGKILL")
        emit("started", 2)  # the replacement the survivors started
        emit("exited", 0, "code=0"); emit("exited", 2, "code=0")
    """
    outcome, _, _, log, _ = run(body, in_place=True)
    assert outcome.code == 0, outcome.message
    assert "horarun: replacement process 2 started on host host2" in log
    assert "ranks 0, 2 finished in place" in outcome.message
    # a process a world started for a new slot says so
    _, _, _, log, _ = run(body.replace('emit("started", 2)', 'emit("started", 2, "new")'),
                          in_place=True)
    assert "horarun: new process 2 started on host host2" in log
    # a replacement that failed, as its peers went on, does not fail the job
    outcome, *_ = run(body.replace('emit("exited", 2, "code=0")',
                                   'emit("exited", 2, "signal=SIGKILL")'), in_place=True)
    assert outcome.code == 0, outcome.message
    # but a replacement whose end was never reported does
    outcome, *_ = run(body.replace('emit("exited", 2, "code=0")', ''), in_place=True)
    assert outcome.code != 0


def test_a_daemon_lost_on_a_host_the_job_grew_onto_names_the_open_mpi_fault():
    # One rank launched on host0; a process started in place on host1 (a
    # host mpirun added as the job grew); then host1's daemon is lost.
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1, "new")
        sys.stderr.write("  Remote daemon: [prterun-x@0,2] on node host1\\n")
        sys.exit(1)
    """, num_proc=1, in_place=True)
    assert outcome.code == 1 and outcome.lost_host == "host1"
    assert outcome.message == (
        "horarun: host host1 was lost (mpirun lost its daemon there), and with it rank(s) 1; "
        "the job was stopped (the job had grown in place onto host(s) host1: Open MPI 5.0's "
        "daemons can crash after that, in their direct modex handler; --transport tcp starts "
        "new processes without them)")
    # A host the launch had ranks on: no such note.
    outcome, *_ = run("""
        emit("started", 0); emit("started", 1)
        sys.stderr.write("  Remote daemon: [prterun-x@0,1] on node host1\\n")
        sys.exit(1)
    """)
    assert "grown in place" not in outcome.message
