"""Unit tests of horarun's elastic mode: options, host discovery, the
blacklist, the state directory, and the elastic loop with launches that
are faked (the real thing runs in tests/test_elastic_jobs.py)."""

import os
import socket

import pytest

from hora.common.elastic.run import RESET_EXIT_CODE
from hora.runner import cli, elastic, markers, supervise
from hora.runner.hosts import Host


def _script(tmp_path, text, code=0):
    path = tmp_path / "discover.sh"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


def test_elastic_options_turn_on_with_min_np_and_default_max_np_to_np():
    args = cli.parse_args(["-np", "4", "--min-np", "2", "python", "train.py"])
    assert args.elastic.min_np == 2 and args.elastic.max_np == 4
    assert args.elastic.reset_limit is None and args.elastic.elastic_timeout == 600.0
    assert cli.parse_args(["-np", "2", "python", "train.py"]).elastic is None


def test_discovery_without_max_np_takes_every_slot():
    # and without --min-np needs -np ranks, as in Horovod
    args = cli.parse_args(["-np", "2", "--host-discovery-script", "./d.sh", "python", "t.py"])
    assert args.elastic.max_np is None and args.elastic.min_np == 2


@pytest.mark.parametrize("argv, message", [
    (["-np", "4", "--min-np", "3", "--max-np", "2"], "--max-np 2 is below --min-np 3"),
    (["-np", "1", "--min-np", "2"], "-np 1 is below --min-np 2"),
    (["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "9", "3"],
     "--blacklist-cooldown-range: MIN_S is above MAX_S"),
])
def test_contradictory_elastic_options_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.parse_args([*argv, "python", "train.py"])
    assert message in capsys.readouterr().err


def test_discovery_reads_hosts_with_and_without_slots(tmp_path):
    script = _script(tmp_path, "# comment\nnode1:4\n\nnode2\n")
    found = elastic.Discovery(script, slots_per_host=2, fixed=[]).hosts()
    assert found == [Host("node1", 4), Host("node2", 2)]


def test_discovery_failure_is_reported(tmp_path):
    discovery = elastic.Discovery(_script(tmp_path, "", code=3), None, [])
    assert discovery.hosts() is None
    assert "exited with 3" in discovery.last_error
    discovery = elastic.Discovery(_script(tmp_path, "node1:zero\n"), None, [])
    assert discovery.hosts() is None and "'node1:zero'" in discovery.last_error


def test_a_host_is_blacklisted_after_repeated_failures_for_its_cooldown(monkeypatch):
    said = []
    blacklist = elastic.Blacklist(cooldown_range=(5.0, 5.0))
    now = [100.0]
    monkeypatch.setattr(elastic.time, "monotonic", lambda: now[0])
    hosts = [Host("a", 1), Host("b", 1)]
    for _ in range(elastic.HOST_FAILURES_BEFORE_BLACKLIST - 1):
        blacklist.record("a", healthy=False, log=said.append)
    assert blacklist.usable(hosts) == hosts
    blacklist.record("a", healthy=True, log=said.append)  # a long run forgives
    for _ in range(elastic.HOST_FAILURES_BEFORE_BLACKLIST - 1):
        blacklist.record("a", healthy=False, log=said.append)
    assert blacklist.usable(hosts) == hosts and not said
    blacklist.record("a", healthy=False, log=said.append)
    assert blacklist.usable(hosts) == [Host("b", 1)]
    assert "not used for the next 5 s" in said[0]
    now[0] += 6
    assert blacklist.usable(hosts) == hosts


def test_the_state_directory_follows_the_command_unless_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one = elastic.state_directory({}, ["python", "a.py"])
    assert one == elastic.state_directory({}, ["python", "a.py"])
    assert one != elastic.state_directory({}, ["python", "b.py"])
    assert elastic.state_directory({"HORA_ELASTIC_STATE_DIR": "/x"}, ["python"]) == "/x"


def _options(**overrides):
    values = dict(min_np=1, max_np=2, discovery_script=None, slots_per_host=None,
                  reset_limit=None, cooldown_range=None, elastic_timeout=1.0)
    values.update(overrides)
    return elastic.ElasticOptions(**values)


def _failed(host="localhost", code=137):
    outcome = f"code={code}" if code != 137 else "signal=SIGKILL"
    marker = markers.Marker("exited", 1, host, outcome, 0.0)
    return supervise.Outcome(code, f"horarun: rank 1 on host {host} failed first", marker)


def test_the_loop_relaunches_after_a_failure_and_counts_resets():
    launches, said = [], []
    outcomes = [_failed(), _failed(code=RESET_EXIT_CODE), supervise.Outcome(0)]

    def launch(num_proc, hosts, extra):
        launches.append((num_proc, hosts, dict(extra)))
        return outcomes[len(launches) - 1]

    discovery = elastic.Discovery(None, None, [Host("localhost", 2)])
    code = elastic.run(_options(), discovery, launch, {}, ["python", "t.py"], said.append)
    assert code == 0
    assert [n for n, _, _ in launches] == [2, 2, 2]
    assert [extra["HORA_ELASTIC_RESTARTS"] for _, _, extra in launches] == ["0", "1", "2"]
    assert all(hosts is None for _, hosts, _ in launches)  # this machine only
    assert "elastic reset 1: rank 1 on host localhost failed first" in said[0]
    assert "horarun: world 2: 2 rank(s) on localhost:2" in said[1]
    assert "elastic reset 2: rank 1 on host localhost left for a new world (a peer was lost)" \
        in said[2]


def test_the_loop_stops_at_the_reset_limit_and_on_ctrl_c():
    said = []
    discovery = elastic.Discovery(None, None, [Host("localhost", 2)])
    code = elastic.run(_options(reset_limit=0), discovery, lambda *a: _failed(), {}, ["x"],
                       said.append)
    assert code == 137 and "(--reset-limit 0), so it stops here" in said[-1]
    stopped = supervise.Outcome(130, "horarun: job stopped by SIGINT", stopped=True)
    assert elastic.run(_options(), discovery, lambda *a: stopped, {}, ["x"], said.append) == 130


def test_the_first_world_is_capped_at_np_and_at_least_min_np(tmp_path):
    launches = []
    script = _script(tmp_path, "localhost:4\n")
    discovery = elastic.Discovery(script, None, [])

    def launch(num_proc, hosts, extra):
        launches.append(num_proc)
        return supervise.Outcome(0)

    elastic.run(_options(max_np=None, min_np=2), discovery, launch, {}, ["x"], print,
                first_np=1)
    assert launches == [2]


def test_a_job_on_other_hosts_gets_their_world(tmp_path):
    seen = []
    discovery = elastic.Discovery(None, None, [Host("node1", 2), Host("node2", 2)])
    elastic.run(_options(max_np=3), discovery,
                lambda n, hosts, extra: seen.append((n, hosts, extra)) or supervise.Outcome(0),
                {}, ["x"], print)
    num_proc, hosts, extra = seen[0]
    assert num_proc == 3 and hosts == [Host("node1", 2), Host("node2", 1)]
    assert not extra["HORA_ELASTIC_SUPERVISOR"].startswith("127.0.0.1")


def test_notifier_tells_a_rank_that_connects_after_the_change():
    import socket
    notifier = elastic.Notifier("127.0.0.1")
    try:
        notifier.notify()
        host, port = notifier.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as connection:
            line = connection.makefile("r").readline()
        assert line.startswith("hosts-updated ")
    finally:
        notifier.close()


def test_notifier_timestamps_grow_when_the_wall_clock_goes_back(monkeypatch):
    import socket
    notifier = elastic.Notifier("127.0.0.1")
    try:
        for wall_clock in (1000.0, 999.0, 999.0, 1002.0):
            monkeypatch.setattr(elastic.time, "time", lambda now=wall_clock: now)
            notifier.notify()
        monkeypatch.undo()
        host, port = notifier.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as connection:
            lines = connection.makefile("r")
            stamps = [float(lines.readline().split()[1]) for _ in range(4)]
        assert stamps == [1000.0, 1000.000001, 1000.000002, 1002.0]
    finally:
        notifier.close()


def test_a_growth_names_the_new_processes_places_and_the_new_hosts():
    world = [Host("node1", 2)]
    grown = [Host("node1", 3), Host("node2", 2)]
    assert elastic._only_adds(world, grown)
    assert elastic._growth(world, grown) == (5, ["node1:1", "node2:2"], ["node2"])
    # on this machine alone mpirun places them itself
    assert elastic._growth([Host("localhost", 2)], [Host("localhost", 3)]) == (3, [], [])
    # more slots in all, but fewer on a host of the world: a new world
    assert not elastic._only_adds(world, [Host("node1", 1), Host("node2", 2)])


def test_a_growth_message_reads_back_as_it_was_sent():
    from hora.common.elastic.notifications import (growth_line, lower_line, parse_update,
                                                   shrink_line)
    fields = growth_line(12.5, 5, ["node1:1", "node2:2"], ["node2"]).split()
    assert fields[:2] == ["hosts-updated", "12.500000"]
    assert parse_update(fields[2:]) == {"grow": 5, "place": ["node1:1", "node2:2"],
                                        "add": ["node2"]}
    assert parse_update(growth_line(1.0, 3, [], []).split()[2:]) == {
        "grow": 3, "place": [], "add": []}
    assert parse_update(lower_line(2.0, 1, ["node2", "node3"]).split()[2:]) == {
        "lower": 1, "removed": ["node2", "node3"]}
    assert parse_update(lower_line(2.0, 3, []).split()[2:]) == {"lower": 3, "removed": []}
    assert parse_update(shrink_line(3.0, 3, [("node2", 0, "node2.lab"), ("localhost", 1, "vm")])
                        .split()[2:]) == {"shrink": 3, "hosts": [("node2", 0, "node2.lab"),
                                                                 ("localhost", 1, "vm")]}
    assert parse_update([]) is None  # a plain change: a new world


def _state_seeing(messages, expand, lower=None):
    from hora.common.elastic.state import ObjectState
    state = ObjectState(bcast_object=lambda obj, root_rank=0: obj, get_rank=lambda: 0, epoch=0)
    state._growth_expand = (lambda update, start=True: expand(update)) if expand else None
    state._growth_lower = lower
    for timestamp, update in messages:
        state.on_hosts_updated(timestamp, update)
    return state


def test_growths_in_place_start_processes_without_an_interrupt():
    grown = []
    state = _state_seeing([(1.0, {"grow": 3, "place": ["a:1"], "add": []}),
                           (2.0, {"grow": 4, "place": ["b:1"], "add": ["b"]})], grown.append)
    state.check_host_updates()
    assert grown == [{"grow": 4, "place": ["a:1", "b:1"], "add": ["b"]}]
    # heard again by a later rank 0: nothing new
    for timestamp, update in [(1.0, {"grow": 3, "place": ["a:1"], "add": []})]:
        state.on_hosts_updated(timestamp, update)
    state.check_host_updates()
    assert len(grown) == 1


def test_hosts_gone_with_their_ranks_lower_the_world_without_an_interrupt():
    calls = []
    lower = {"lower": 1, "removed": ["b"]}
    state = _state_seeing([(1.0, lower)], lambda u: calls.append(("grow", u)),
                          lambda u: calls.append(("lower", u)))
    state.check_host_updates()
    assert calls == [("lower", {"lower": 1, "removed": ["b"], "last": True})]
    # in the order heard: removed, then listed again (the growth is measured
    # without the removed host), or the other way round
    calls.clear()
    grow = {"grow": 2, "place": ["b:1"], "add": ["b"]}
    state = _state_seeing([(1.0, lower), (2.0, grow)], lambda u: calls.append(("grow", u)),
                          lambda u: calls.append(("lower", u)))
    state.check_host_updates()
    assert [kind for kind, _ in calls] == ["lower", "grow"]
    calls.clear()
    state = _state_seeing([(1.0, grow), (2.0, lower)], lambda u: calls.append(("grow", u)),
                          lambda u: calls.append(("lower", u)))
    state.check_host_updates()
    assert [kind for kind, _ in calls] == ["grow", "lower"]
    # a world that starts no processes has nothing to lower
    state = _state_seeing([(1.0, lower)], None, None)
    state.check_host_updates()


def test_a_lower_world_starts_no_process_for_ranks_lost_with_their_host(monkeypatch):
    from hora.common import basics
    from hora.common.elastic import growth as growth_module
    monkeypatch.setattr(basics, "rank", lambda: 0)
    monkeypatch.setattr(basics, "size", lambda: 1)
    growth = growth_module.Growth({"HORA_ELASTIC_IN_PLACE": "1", "HORA_SIZE": "3"})
    growth.place, growth.add, growth.new_slots = ["b:1", "c:1"], ["b", "c"], 1
    growth.lower({"lower": 2, "removed": ["b"]})
    assert (growth.target, growth.place, growth.add, growth.new_slots) == (2, ["c:1"], ["c"], 1)
    growth.lower({"lower": 1, "removed": ["c"]})
    assert (growth.target, growth.place, growth.add, growth.new_slots) == (1, [], [], 0)
    # a report of more hosts than the world comes back to changes nothing
    growth.lower({"lower": 4, "removed": []})
    assert growth.target == 1


def test_fewer_slots_where_ranks_run_ask_the_ranks_beyond_them_to_leave(monkeypatch):
    monkeypatch.setattr(elastic.socket, "gethostname", lambda: "vm")
    monkeypatch.setattr(elastic, "LOCAL_NAMES", {"localhost", "127.0.0.1", "vm"})
    world = [Host("node1", 2), Host("node2", 2), Host("node3", 1)]
    usable = [Host("node1", 2), Host("node2", 1)]
    live = {"node1": 2, "node2.lab": 2, "node3": 1}
    # node2 (its ranks report it with its domain) keeps 1 slot, node3 none
    assert elastic._shrink(world, usable, live) == {"node2": (1, "node2.lab", 2),
                                                    "node3": (0, "node3", 1)}
    # nothing fewer: nothing to do
    assert elastic._shrink(world, world + [Host("node4", 1)], live) == {}
    # this machine's ranks report its own name
    assert elastic._shrink([Host("localhost", 3)], [Host("localhost", 2)], {"vm": 3}) == {
        "localhost": (2, "vm", 3)}
    # ranks of one listed host that report two names: both are sent
    two = elastic._shrink([Host("box", 4)], [Host("box", 1)], {"box": 2, "box.lab": 2})
    assert two == {"box": (1, "box|box.lab", 4)}
    # a host whose ranks were lost already holds none
    assert elastic._shrink(world, usable, {"node1": 2}) == {"node2": (1, "node2", 0),
                                                            "node3": (0, "node3", 0)}


def test_the_ranks_beyond_a_hosts_slots_leave_the_lowest_staying():
    from hora.common.elastic.run import leavers
    hosts = ["a", "b", "a", "b", "c", "b"]
    # b keeps 1 of its 3 ranks (1, 3, 5), c none
    assert leavers(hosts, {"shrink": 3, "hosts": [("b", 1, "b"), ("c", 0, "c")]}) == [3, 4, 5]
    # named with a domain, or not at all (its ranks were lost already)
    assert leavers(hosts, {"shrink": 4, "hosts": [("a", 0, "a.lab")]}) == [0, 2]
    assert leavers(hosts, {"shrink": 5, "hosts": [("d", 0, "d")]}) == []
    # every name the host's ranks report counts
    assert leavers(["x", "y", "x", "y"], {"shrink": 1, "hosts": [("h", 1, "x|y")]}) == [1, 2, 3]


def _state_departing(messages, grow=None, lower=None):
    state = _state_seeing(messages, grow, lower)
    state._departs_in_place = True
    return state


def test_ranks_to_leave_interrupt_at_a_commit_with_every_change_since_the_last():
    from hora.common.exceptions import HostsUpdatedInterrupt
    shrink = {"shrink": 2, "hosts": [("b", 0, "b")]}
    grow = {"grow": 3, "place": ["c:1"], "add": ["c"]}
    calls = []
    state = _state_departing([(1.0, shrink), (2.0, grow)], calls.append, calls.append)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()
    # nothing is acted on before the ranks left (a growth started now
    # would go with the old world)
    assert calls == [] and state._growth_found == "depart"
    assert state._departure == {"shrink": dict(shrink, last=False), "grow": grow, "lower": None}
    # two for the same host: the newer counts
    state = _state_departing([(1.0, shrink), (2.0, {"shrink": 3, "hosts": [("b", 1, "b")]})])
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()
    assert state._departure["shrink"] == {"shrink": 3, "hosts": [("b", 1, "b")], "last": True}
    # not in place: a new world
    state = _state_seeing([(1.0, shrink)], [].append)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()
    assert state._growth_found is None


def test_a_growth_heard_with_ranks_leaving_starts_nothing_until_the_size_is_known(monkeypatch):
    from hora.common import basics
    from hora.common.elastic import growth as growth_module
    monkeypatch.setattr(basics, "rank", lambda: 1)
    monkeypatch.setattr(basics, "size", lambda: 3)
    growth = growth_module.Growth({"HORA_ELASTIC_IN_PLACE": "1", "HORA_SIZE": "4"})
    started = []
    monkeypatch.setattr(growth, "replace_lost", lambda: started.append(growth.target))
    state = _state_departing([])
    state._growth_expand = growth.expand
    # 4 slots, then 5, then 3 (heard last): nothing starts for the 5
    state._act_on_sizes({"grow": 5, "place": [], "add": []}, None, start=False)
    assert started == [] and growth.target == 5
    growth.departed({"shrink": 3, "hosts": [("localhost", 3, "vm")]})
    assert growth.target == 3
    state._act_on_sizes({"grow": 6, "place": [], "add": []}, None)
    assert started == [6]


def test_host_changes_are_kept_when_the_check_fails_on_a_lost_rank():
    from hora.common.elastic.state import ObjectState
    from hora.common.exceptions import HoraInternalError
    grown = []

    def broken(obj, root_rank=0):
        raise HoraInternalError("a rank was lost")
    state = ObjectState(bcast_object=broken, get_rank=lambda: 0, epoch=0)
    state._growth_expand = lambda update, start=True: grown.append(update)
    state.on_hosts_updated(1.0, {"grow": 3, "place": [], "add": []})
    with pytest.raises(HoraInternalError):
        state.check_host_updates()
    # the next world's check (same rank 0) still acts on it
    state._bcast_object = lambda obj, root_rank=0: obj
    state.check_host_updates()
    assert grown == [{"grow": 3, "place": [], "add": []}]


def test_a_world_that_ranks_left_places_nothing_where_slots_went(monkeypatch):
    from hora.common import basics
    from hora.common.elastic import growth as growth_module
    monkeypatch.setattr(basics, "rank", lambda: 0)
    monkeypatch.setattr(basics, "size", lambda: 2)
    growth = growth_module.Growth({"HORA_ELASTIC_IN_PLACE": "1", "HORA_SIZE": "4"})
    growth.place, growth.add, growth.new_slots = ["b:1", "c:1", "d:1"], ["c", "d"], 2
    growth.departed({"shrink": 3, "hosts": [("b", 1, "b"), ("c", 0, "c")]})
    assert (growth.target, growth.place, growth.add, growth.new_slots) == (3, ["d:1"], ["d"], 1)


@pytest.mark.parametrize("messages,expand", [
    ([(1.0, None)], [].append),                                   # hosts gone
    ([(1.0, {"grow": 3, "place": [], "add": []}), (2.0, None)], [].append),
    ([(1.0, {"grow": 3, "place": [], "add": []})], None),        # not in place
])
def test_other_host_changes_interrupt_for_a_new_world(messages, expand):
    from hora.common.exceptions import HostsUpdatedInterrupt
    state = _state_seeing(messages, expand)
    with pytest.raises(HostsUpdatedInterrupt):
        state.check_host_updates()


def test_state_commit_survives_in_the_store(tmp_path):
    from hora.common.elastic.state import ObjectState
    from hora.common.elastic.store import CommitStore
    store = CommitStore(str(tmp_path), writer=True)
    state = ObjectState(bcast_object=lambda obj, root_rank=0: obj, get_rank=lambda: 0,
                        epoch=1, data=[1, 2])
    state._store = store
    state.data.append(3)
    state.commit()
    state.epoch = 7
    store.flush()
    assert store.newest() == 1
    again = ObjectState(bcast_object=lambda obj, root_rank=0: obj, get_rank=lambda: 0,
                        epoch=0, data=[])
    commit, snapshot = store.load()
    again.load_snapshot(snapshot)
    again.restore()
    assert (commit, again.epoch, again.data) == (1, 1, [1, 2, 3])
    store.clear()
    assert store.newest() == 0 and not os.path.exists(store.path)


def test_a_torn_state_file_counts_as_no_commit(tmp_path):
    from hora.common.elastic.store import CommitStore
    store = CommitStore(str(tmp_path), writer=True)
    (tmp_path / "state.pkl").write_bytes(b"hora-elastic-state v1 commit=12")
    assert store.newest() == 0




def test_a_program_failing_the_same_way_at_start_ends_after_three_worlds():
    launches, said = [], []

    def launch(num_proc, hosts, extra):
        launches.append(num_proc)
        return _failed(host="vm", code=1)  # an ImportError, say, on every world

    discovery = elastic.Discovery(None, None, [Host("localhost", 2)])
    code = elastic.run(_options(), discovery, launch, {}, ["x"], said.append)
    assert code == 1 and len(launches) == elastic.SAME_FAILURES_BEFORE_STOP
    assert "failed the same way in 3 worlds in a row" in said[-1], said


def test_killed_ranks_are_not_a_fault_of_the_program():
    # SIGKILLs (a chaos test, the OOM killer) relaunch as long as they come.
    outcomes = [_failed()] * 5 + [supervise.Outcome(0)]
    launches = []

    def launch(num_proc, hosts, extra):
        launches.append(num_proc)
        return outcomes[len(launches) - 1]

    discovery = elastic.Discovery(None, None, [Host("localhost", 2)])
    options = _options(cooldown_range=(0.0, 0.0))  # the blacklist lets the host back at once
    assert elastic.run(options, discovery, launch, {}, ["x"], print) == 0
    assert len(launches) == 6


def test_a_host_whose_ranks_never_start_is_retried_with_back_off_then_blacklisted(monkeypatch):
    pauses, launches, said = [], [], []
    monkeypatch.setattr(elastic.time, "sleep", pauses.append)

    def launch(num_proc, hosts, extra):
        launches.append(hosts)
        if any(h.name == "nosuchhost.invalid" for h in hosts):
            # mpirun's daemon could not reach the host: its ranks (0, 1)
            # never started, and no rank failed.
            return supervise.Outcome(1, "horarun: job failed with exit code 1",
                                     started=frozenset({2, 3}))
        return supervise.Outcome(0)

    discovery = elastic.Discovery(None, None, [Host("nosuchhost.invalid", 2), Host("node2", 2)])
    code = elastic.run(_options(min_np=2, max_np=4), discovery, launch, {}, ["x"], said.append)
    assert code == 0
    assert len(launches) == elastic.HOST_FAILURES_BEFORE_BLACKLIST + 1
    assert launches[-1] == [Host("node2", 2)]
    assert pauses[:2] == [0.5, 1.0]
    assert any("host nosuchhost.invalid failed 3 launches in a row" in line for line in said), said
    assert "before rank(s) on nosuchhost.invalid started" in said[0], said


def test_a_lost_host_alone_is_blamed_and_the_job_goes_on_without_it(monkeypatch):
    # Host c2 dies while training; the next launches fail to start there
    # (its daemon never reports back) before the ranks on c1 start too.
    # Only c2 counts the failures, so c1 carries on alone.
    pauses, launches, said = [], [], []
    monkeypatch.setattr(elastic.time, "sleep", pauses.append)

    def launch(num_proc, hosts, extra):
        launches.append(hosts)
        if any(h.name == "c2" for h in hosts):
            started = frozenset({0, 1}) if len(launches) == 1 else frozenset()
            return supervise.Outcome(255, "horarun: host c2 was lost", started=started,
                                     lost_host="c2.cluster.local")
        return supervise.Outcome(0)

    discovery = elastic.Discovery(None, None, [Host("c1", 1), Host("c2", 1)])
    code = elastic.run(_options(min_np=1, max_np=2), discovery, launch, {}, ["x"], said.append)
    assert code == 0, said
    assert launches[-1] == [Host("c1", 1)]
    assert len(launches) == elastic.HOST_FAILURES_BEFORE_BLACKLIST + 1
    assert any("host c2 failed 3 launches in a row" in line for line in said), said
    assert not any("host c1 failed" in line for line in said), said


def test_a_failing_discovery_script_is_reported_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(elastic, "DISCOVERY_INTERVAL_S", 0.05)
    said = []
    discovery = elastic.Discovery(_script(tmp_path, "garbage:::\n", code=2), None, [])
    code = elastic.run(_options(elastic_timeout=0.5), discovery, lambda *a: supervise.Outcome(0),
                       {}, ["x"], said.append)
    assert code == 1
    assert "exited with 2" in said[0] and "trying again until --elastic-timeout" in said[0], said
    assert sum("exited with 2" in line for line in said) == 2, said  # at once, and at the end


def test_elastic_in_place_turns_on_elastic_mode_and_reaches_the_ranks():
    args = cli.parse_args(["-np", "3", "--elastic-in-place", "python", "train.py"])
    assert args.elastic.in_place and args.elastic.min_np == 3 and args.elastic.max_np == 3
    seen = []
    discovery = elastic.Discovery(None, None, [Host("localhost", 3)])
    elastic.run(args.elastic, discovery,
                lambda n, hosts, extra: seen.append(extra) or supervise.Outcome(0), {}, ["x"],
                print)
    assert seen[0]["HORA_ELASTIC_IN_PLACE"] == "1"
    relaunching = cli.parse_args(["-np", "3", "--min-np", "1", "python", "train.py"]).elastic
    elastic.run(relaunching, discovery,
                lambda n, hosts, extra: seen.append(extra) or supervise.Outcome(0), {}, ["x"],
                print)
    assert not relaunching.in_place and "HORA_ELASTIC_IN_PLACE" not in seen[1]


def test_a_failed_process_is_blamed_on_the_host_it_ran_on_as_discovery_names_it():
    world = [Host("ns-a", 2)]
    grown = [Host("ns-a", 2), Host("ns-b", 1)]
    assert elastic._host_of(world, 1, "ns-a.example", grown) == "ns-a"  # by launch order
    # started in place on the host the job grew onto, not the launch's last
    assert elastic._host_of(world, 2, "ns-b.example", grown) == "ns-b"
    # this machine, which discovery calls localhost
    local = [Host("localhost", 2)]
    assert elastic._host_of(local, 3, socket.gethostname(), local) == "localhost"
    assert elastic._host_of(world, 5, "elsewhere", grown) == "elsewhere"


def test_a_rank_that_left_ends_even_when_a_thread_of_the_program_holds_it():
    import subprocess
    import sys
    import time
    program = ("import threading, time\n"
               "from hora.common.elastic.run import _end_within\n"
               "threading.Thread(target=time.sleep, args=(600,)).start()  # not a daemon\n"
               "_end_within(0.5, 3)\n"
               "raise SystemExit(0)\n")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - began < 30
    assert "rank 3 left the job 0.5 s ago and its process has not ended" in done.stderr

