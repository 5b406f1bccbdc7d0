"""Which hosts a job runs on and how many ranks each may take.

Two spellings are accepted, the ones ``mpirun`` users already have:

- a host string for ``-H``: ``host1:2,host2:4`` (a host without ``:N`` has
  one slot);
- a hostfile for ``--hostfile``: one host per line as ``host slots=N``,
  ``host:N`` or just ``host``, with ``#`` comments and blank lines allowed.

horarun reads both itself and hands mpirun one host list, so a malformed
entry is reported with its position before anything starts, whichever MPI
is installed.
"""
import dataclasses
import re

# Host names and addresses as DNS, /etc/hosts and IPv4 write them. Anything
# else (spaces, shell characters) is refused rather than passed on.
_HOST_RE = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.\-]*[A-Za-z0-9_])?$")


class HostError(ValueError):
    """A host string or hostfile that cannot be understood."""


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    slots: int


def _slots(text, where):
    try:
        value = int(text)
    except ValueError:
        raise HostError(f"{where}: slot count {text!r} is not a whole number") from None
    if value < 1:
        raise HostError(f"{where}: slot count must be at least 1, got {value}")
    return value


def _name(text, where):
    if not _HOST_RE.match(text):
        raise HostError(f"{where}: {text!r} is not a valid host name")
    return text


def _merge(hosts, where_of):
    """Adds up the slots of a host named more than once, keeping first-seen order."""
    merged = {}
    for host in hosts:
        if host.name in merged:
            merged[host.name] = Host(host.name, merged[host.name].slots + host.slots)
        else:
            merged[host.name] = host
    if not merged:
        raise HostError(f"{where_of}: no hosts given")
    return list(merged.values())


def parse_host_string(text):
    """``"a:2,b:1"`` -> [Host("a", 2), Host("b", 1)]."""
    hosts = []
    for position, item in enumerate(text.split(","), start=1):
        item = item.strip()
        where = f"-H entry {position} ({item!r})"
        if not item:
            raise HostError(f"-H {text!r}: entry {position} is empty")
        name, sep, count = item.partition(":")
        hosts.append(Host(_name(name, where), _slots(count, where) if sep else 1))
    return _merge(hosts, f"-H {text!r}")


def parse_hostfile_text(text, source="hostfile"):
    """Parses the contents of a hostfile; ``source`` names it in errors."""
    hosts = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source}, line {number} ({raw.strip()!r})"
        fields = line.split()
        head = fields[0]
        slots = None
        if ":" in head:
            name, _, count = head.partition(":")
            slots = _slots(count, where)
        else:
            name = head
        for extra in fields[1:]:
            key, sep, value = extra.partition("=")
            if key in ("slots", "max_slots", "max-slots") and sep:
                count = _slots(value, where)
                if key == "slots":
                    if slots is not None:
                        raise HostError(f"{where}: slots given twice")
                    slots = count
                # max_slots only caps what mpirun may oversubscribe; the
                # slot count is what decides the placement.
            else:
                raise HostError(f"{where}: expected 'host slots=N' or 'host:N', "
                                f"cannot read {extra!r}")
        hosts.append(Host(_name(name, where), slots or 1))
    return _merge(hosts, source)


def parse_hostfile(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise HostError(f"cannot read hostfile {path!r}: {exc.strerror}") from None
    return parse_hostfile_text(text, source=f"hostfile {path}")


def total_slots(hosts):
    return sum(host.slots for host in hosts)


def ranks_per_host(hosts, num_proc):
    """How many ranks land on each host when they fill the slots in order
    (mpirun's default "by slot" placement); beyond the slots, the extra
    ranks go round the hosts again one at a time."""
    counts = [0] * len(hosts)
    left = num_proc
    for i, host in enumerate(hosts):
        take = min(host.slots, left)
        counts[i] = take
        left -= take
    i = 0
    while left > 0:
        counts[i % len(hosts)] += 1
        left -= 1
        i += 1
    return counts


def host_string(hosts):
    """The ``a:2,b:1`` form that Open MPI's ``-H`` and MPICH's ``-hosts`` take."""
    return ",".join(f"{host.name}:{host.slots}" for host in hosts)


def machinefile_text(hosts):
    """The ``host:N`` lines that Hydra's machine files take."""
    return "".join(f"{host.name}:{host.slots}\n" for host in hosts)


def same_host(a, b):
    """Whether two names are one host: mpirun, discovery and the host itself
    may name it with or without its domain, so names match up to their
    first dot too."""
    return a == b or a.split(".")[0] == b.split(".")[0]
