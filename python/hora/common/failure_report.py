"""Tells horarun when this rank's program dies of an exception it did not
catch, so that horarun can name the rank whose failure started a job's end.

Without it, horarun can only compare when ranks exited: a rank that raises
shuts hora down on its way out, its peers then fail with
``HoraShutdownError`` and may exit before it does. The report is one line,
``raised TIME own`` (or ``peer`` for the errors a rank gets because of
another: a lost peer, a shutdown, a stall), on the pipe that horarun's
rank wrapper names in HORA_RUNNER_REPORT_FD; outside horarun nothing is
installed.
"""

from __future__ import annotations

import os
import sys
import time

from hora.common.exceptions import HoraInternalError, HoraShutdownError, HoraTimeoutError

_installed = False


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
                whose = "peer" if issubclass(
                    kind, (HoraInternalError, HoraShutdownError, HoraTimeoutError)) else "own"
                os.write(fd, f"raised {time.time():.6f} {whose}\n".encode())
            except OSError:
                pass  # horarun's wrapper is gone: nobody to tell
        previous(kind, error, trace)

    sys.excepthook = report
    _installed = True
