"""The pieces of hora.spark / hora.ray that need no cluster: host grouping,
which failure is reported, the store's layout and the ssh agent's refusal."""
import subprocess
import sys
import time

from hora.cluster.driver_service import Task, group_hosts
from hora.cluster.job import root_cause_order
from hora.spark.common.store import LocalStore


def test_hosts_are_grouped_in_order_of_their_lowest_task():
    tasks = [Task(2, "b", ("10.0.0.2", 1), 1), Task(0, "a", ("10.0.0.1", 1), 1),
             Task(1, "b", ("10.0.0.2", 2), 1), Task(3, "a", ("10.0.0.1", 2), 1)]
    groups = group_hosts(tasks)
    assert [(g.alias, g.hostname, g.tasks) for g in groups] == [
        ("hora-host-0", "a", (0, 3)), ("hora-host-1", "b", (1, 2))]


def test_the_first_own_error_comes_before_errors_caused_by_it():
    failures = [("HoraShutdownError", 1.0, 0), ("ValueError", 2.0, 2), ("KeyError", 3.0, 1),
                ("hora.common.exceptions.HoraInternalError", 0.5, 3)]
    ordered = sorted(failures, key=lambda f: root_cause_order(*f))
    assert [f[0] for f in ordered][:2] == ["ValueError", "KeyError"]


def test_local_store_layout(tmp_path):
    store = LocalStore("file://" + str(tmp_path))
    assert store.get_train_data_path() == str(tmp_path / "intermediate_train_data")
    assert store.get_train_data_path(1).endswith("intermediate_train_data.1")
    assert store.get_checkpoint_path("r1") == str(tmp_path / "runs" / "r1" / "checkpoint.pt")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "part-1.parquet").write_text("")
    (tmp_path / "d" / "part-0.parquet").write_text("")
    (tmp_path / "d" / "_SUCCESS").write_text("")
    assert [p.rsplit("/", 1)[1] for p in store.parquet_files(str(tmp_path / "d"))] == [
        "part-0.parquet", "part-1.parquet"]


def test_ssh_agent_outside_a_job_says_what_is_missing():
    done = subprocess.run([sys.executable, "-m", "hora.cluster.ssh_agent", "hora-host-0", "true"],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0
    assert "HORA_CLUSTER_KEY is not set" in done.stderr


def test_a_silent_peer_holds_up_no_one_and_a_wrong_key_is_refused():
    import socket
    import threading
    from multiprocessing import AuthenticationError

    import pytest

    from hora.cluster import channel
    key = channel.new_key()

    def echo(conn, peer_ip):
        with conn:
            conn.send((conn.recv(), peer_ip))

    before = threading.active_count()
    server = channel.Server(key, echo)
    silent = socket.create_connection(("127.0.0.1", server.port))  # connects, never speaks
    with channel.connect(("127.0.0.1", server.port), key) as conn:
        conn.send("ping")
        assert conn.recv() == ("ping", "127.0.0.1")
    with pytest.raises((AuthenticationError, EOFError, OSError)):
        with channel.connect(("127.0.0.1", server.port), channel.new_key()) as conn:
            conn.send("ping")
            conn.recv()
    silent.close()
    server.close()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before, "the server's threads outlived close()"
