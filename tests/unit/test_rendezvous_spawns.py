"""The launcher's rendezvous (hora.runner.rendezvous) driven over its wire
protocol by sockets standing in for the processes: which processes a
CANCEL gives up."""

import socket
import threading

import pytest

from hora.runner.rendezvous import Rendezvous


class FakeProcess:
    def __init__(self, rendezvous, process_id):
        self.conn = socket.create_connection(("127.0.0.1", rendezvous.port), timeout=10)
        self.reader = self.conn.makefile("rb")
        self.send(f"HELLO {rendezvous.cookie} {process_id}")

    def send(self, text):
        self.conn.sendall((text + "\n").encode())

    def ask(self, kind):
        self.send(f"FORM {kind} localhost 1 127.0.0.1")

    def world(self):
        """The WORLD line's generation, rank and size (the member lines read)."""
        words = self.reader.readline().decode().split()
        assert words[0] == "WORLD", words
        generation, rank, size = (int(w) for w in words[1:4])
        for _ in range(size):
            self.reader.readline()
        return generation, rank, size

    def spawn_state(self):
        """Also a fence: the launcher has handled what this process sent
        before."""
        self.send("SPAWNSTATE")
        words = self.reader.readline().decode().split()
        assert words[0] == "SPAWNSTATE", words
        return words[1]

    def spawn(self, count):
        self.send(f"SPAWN {count} - 1")
        self.send(b"x".hex())

    def close(self):
        self.conn.close()


@pytest.fixture
def rendezvous():
    started, lost = [], []
    event = threading.Event()

    def on_spawn(ids, hosts, argv):
        started.extend(ids)
        event.set()

    def on_lost(process_id, why):
        lost.append((process_id, why))

    r = Rendezvous([0], form_timeout=30, on_spawn=on_spawn, on_lost=on_lost, log=lambda t: None)
    r.started, r.lost_calls, r.spawned = started, lost, event
    yield r
    r.close()


def wait_spawned(rendezvous, count):
    assert rendezvous.spawned.wait(10)
    rendezvous.spawned.clear()
    assert len(rendezvous.started) == count
    return rendezvous.started[-1]


def wait_for(condition):
    for _ in range(500):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("the rendezvous did not get there in 5 s")


def assert_given_up(rendezvous, sender, generation, process_id, alive):
    """``sender``'s CANCEL naming ``generation`` ends ``process_id`` alone."""
    sender.send(f"CANCEL {generation}")
    wait_for(lambda: process_id not in rendezvous.alive())
    assert rendezvous.lost_calls == [(process_id, "the world did not take it in")]
    assert sorted(rendezvous.alive()) == alive


def test_a_late_cancel_ends_only_the_spawn_of_the_world_it_names(rendezvous):
    root = FakeProcess(rendezvous, 0)
    root.ask("init")
    assert root.world() == (1, 0, 1)
    # the first world asks for a process, which joins at the next merge
    root.spawn(1)
    first = wait_spawned(rendezvous, 1)
    joiner = FakeProcess(rendezvous, first)
    joiner.ask("join")
    assert joiner.spawn_state() == "ready"
    root.ask("merge")
    assert root.world() == (2, 0, 2)
    assert joiner.world() == (2, 1, 2)
    # the grown world asks for another; a CANCEL from a rank of the first
    # world, arriving now, must leave it alone
    root.spawn(1)
    second = wait_spawned(rendezvous, 2)
    joiner.send("CANCEL 1")
    assert joiner.spawn_state() == "starting"
    assert second in rendezvous.alive()
    assert rendezvous.lost_calls == []
    # one naming the world that asked for it gives it up
    assert_given_up(rendezvous, joiner, 2, second, [0, first])
    root.close()
    joiner.close()


def test_a_cancel_after_a_merge_ends_the_processes_it_did_not_take_in(rendezvous):
    root = FakeProcess(rendezvous, 0)
    root.ask("init")
    root.world()
    root.spawn(2)
    assert rendezvous.spawned.wait(10)
    early, late = rendezvous.started
    ready = FakeProcess(rendezvous, early)
    ready.ask("join")
    assert ready.spawn_state() == "starting"  # (the other has not asked)
    # the merge takes in the one that is ready; the other still starts
    root.ask("merge")
    assert root.world() == (2, 0, 2)
    assert ready.world() == (2, 1, 2)
    assert_given_up(rendezvous, root, 1, late, [0, early])
    root.close()
    ready.close()
