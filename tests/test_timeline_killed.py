"""A job killed mid-run still leaves a timeline that loads (Perfetto and
chrome://tracing accept the missing closing bracket; so does hora.timeline)."""
import json
import subprocess
import sys

import pytest

from hora.timeline import load_events

SCRIPT = r"""
import os, signal, time
import numpy as np
import hora
hora.init()
for step in range(20):
    hora.allreduce(np.ones(16, np.float32), name=f"killed.{step % 4}")
time.sleep(0.5)  # the writer flushes what it has
if hora.rank() == 0:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(30)
"""


def test_killed_job_leaves_a_loadable_timeline(tmp_path, job_env):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    path = tmp_path / "killed.json"
    done = subprocess.run([sys.executable, "-m", "hora.runner", "-np", "2",
                           "--timeline-filename", str(path), sys.executable, str(script)],
                          env=job_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + 9, done.stderr
    text = path.read_text()
    assert not text.rstrip().endswith("]"), "the file was finished although the job was killed"
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    events = load_events(path)
    rows = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert {f"killed.{k}" for k in range(4)} <= rows, rows
    summary = subprocess.run([sys.executable, "-m", "hora.timeline", "summarize", str(path)],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and "killed.0" in summary.stdout, summary.stderr
