"""Host strings and hostfiles for horarun -H / --hostfile, and slot arithmetic."""
import pytest

from hora.runner.hosts import (
    Host, HostError, host_string, machinefile_text, parse_host_string, parse_hostfile,
    parse_hostfile_text, ranks_per_host, total_slots)


def test_host_string():
    assert parse_host_string("node1:4,node2:2") == [Host("node1", 4), Host("node2", 2)]
    assert parse_host_string("10.0.0.5") == [Host("10.0.0.5", 1)]
    assert parse_host_string(" a:1 , b ") == [Host("a", 1), Host("b", 1)]


def test_host_named_twice_adds_up():
    assert parse_host_string("a:2,b:1,a:3") == [Host("a", 5), Host("b", 1)]


@pytest.mark.parametrize("text, fragment", [
    ("a:0", "at least 1"), ("a:x", "not a whole number"), ("a,,b", "entry 2 is empty"),
    ("a;rm -rf /:2", "not a valid host name"), ("", "entry 1 is empty"),
    (":2", "not a valid host name"), ("-a:1", "not a valid host name")])
def test_bad_host_strings(text, fragment):
    with pytest.raises(HostError, match=fragment):
        parse_host_string(text)


HOSTFILE = """\
# the training cluster
node1 slots=4
node2:2     # two GPUs only

node3 slots=1 max_slots=2
node4
"""


def test_hostfile_forms_comments_and_blank_lines():
    assert parse_hostfile_text(HOSTFILE) == [
        Host("node1", 4), Host("node2", 2), Host("node3", 1), Host("node4", 1)]


@pytest.mark.parametrize("text, fragment", [
    ("a slots=2\nb slots=zero\n", "line 2 .*not a whole number"),
    ("a slots=2\n\n# c\nb cpus=2\n", "line 4 .*cannot read 'cpus=2'"),
    ("a:2 slots=3\n", "line 1 .*slots given twice"),
    ("a slots=0\n", "line 1 .*at least 1"),
    ("bad|host slots=1\n", "line 1 .*not a valid host name"),
    ("# nothing but comments\n\n", "no hosts given")])
def test_bad_hostfiles_name_the_line(text, fragment):
    with pytest.raises(HostError, match=fragment):
        parse_hostfile_text(text)


def test_hostfile_from_disk(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("a slots=2\nb:3\n")
    assert parse_hostfile(str(path)) == [Host("a", 2), Host("b", 3)]
    with pytest.raises(HostError, match="line 1"):
        path.write_text("a slots=\n")
        parse_hostfile(str(path))
    with pytest.raises(HostError, match="cannot read hostfile"):
        parse_hostfile(str(tmp_path / "missing"))


def test_slot_arithmetic():
    hosts = [Host("a", 4), Host("b", 2)]
    assert total_slots(hosts) == 6
    assert ranks_per_host(hosts, 3) == [3, 0]
    assert ranks_per_host(hosts, 6) == [4, 2]
    # Beyond the slots the extra ranks go round the hosts one at a time.
    assert ranks_per_host(hosts, 9) == [6, 3]


def test_rendering_for_mpirun():
    hosts = [Host("a", 4), Host("b", 2)]
    assert host_string(hosts) == "a:4,b:2"
    assert machinefile_text(hosts) == "a:4\nb:2\n"
