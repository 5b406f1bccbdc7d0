"""Making sure nothing a task started outlives it."""
import os
import signal
import time

def _children_map():
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name may hold spaces and parentheses: the fields after
        # the last ')' are fixed
        fields = stat[stat.rfind(b")") + 2:].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid):
    """Every living process below ``pid`` (Linux; empty elsewhere)."""
    if not os.path.isdir("/proc"):
        return []
    children = _children_map()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def kill_tree(proc, grace_s=3.0):
    """SIGTERM ``proc`` (a Popen) and everything below it, SIGKILL what is
    left after ``grace_s``."""
    pids = descendants(proc.pid) + [proc.pid]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if proc.poll() is None or any(_alive(pid) for pid in pids if pid != proc.pid):
                time.sleep(0.05)
                continue
            break
        else:
            continue
        break
    try:
        proc.wait(timeout=grace_s)
    except Exception:  # noqa: BLE001 - best effort; the process is SIGKILLed already
        pass
