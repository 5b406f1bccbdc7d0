"""Tells horarun when this rank's program dies of an exception it did not
catch, so that horarun can name the rank whose failure started a job's end.

Without it, horarun can only compare when ranks exited: a rank that raises
shuts hora down on its way out, its peers then fail with
``HoraShutdownError`` and may exit before it does. The report is one line,
``raised TIME own`` (or ``peer`` for the errors a rank gets because of
another: a lost peer, a shutdown, a stall; ``peer=N`` when the error names
the rank N that caused it: a lost or stopped rank), on the pipe that horarun's
rank wrapper names in HORA_RUNNER_REPORT_FD; outside horarun nothing is
installed.
"""

from __future__ import annotations

import os
import re
import sys
import time

from hora.common.exceptions import HoraInternalError, HoraShutdownError, HoraTimeoutError

_installed = False

# The messages in which hora's core names the rank that broke the job.
_CULPRIT = re.compile(r"^(?:rank (\d+) (?:has not been heard from|stopped answering|is gone)"
                      r"|lost the connection to rank (\d+))")


def whose(kind, error) -> str:
    """'own', 'peer', or 'peer=N' for an uncaught exception of class `kind`."""
    if not issubclass(kind, (HoraInternalError, HoraShutdownError, HoraTimeoutError)):
        return "own"
    found = _CULPRIT.match(str(error))
    return f"peer={found.group(1) or found.group(2)}" if found else "peer"


def install() -> None:
    """Chains a ``sys.excepthook`` that writes the report, then calls the
    hook that was there (which prints the traceback). Idempotent."""
    global _installed
    value = os.environ.get("HORA_RUNNER_REPORT_FD", "")
    if _installed or not value.isdigit():
        return
    fd = int(value)
    previous = sys.excepthook

    def report(kind, error, trace):
        if not issubclass(kind, (KeyboardInterrupt, SystemExit)):
            try:
                os.write(fd, f"raised {time.time():.6f} {whose(kind, error)}\n".encode())
            except OSError:
                pass  # horarun's wrapper is gone: nobody to tell
        previous(kind, error, trace)

    sys.excepthook = report
    _installed = True
