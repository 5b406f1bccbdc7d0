"""How a rank's uncaught exception is reported to horarun: its own error,
a peer's, or a peer's that names the rank which caused it."""
import pytest

from hora.common import failure_report
from hora.common.exceptions import (HoraInternalError, HoraInvalidArgumentError,
                                    HoraShutdownError, HoraTimeoutError)


@pytest.mark.parametrize("kind,message,expected", [
    (ValueError, "bad batch", "own"),
    (HoraInvalidArgumentError, "rank 1 refused its call", "own"),
    (HoraShutdownError, "hora has been shut down on this rank", "peer"),
    (HoraTimeoutError, "hora stopped the job: collectives waited", "peer"),
    (HoraTimeoutError, "rank 2 has not been heard from for 3.0 s (stopped", "peer=2"),
    (HoraTimeoutError, "rank 12 stopped answering: rank 0 heard nothing", "peer=12"),
    (HoraInternalError, "lost the connection to rank 3 (its process has probably exited", "peer=3"),
    (HoraInternalError, "rank 1 is gone: rank 0 lost its connection", "peer=1"),
])
def test_whose(kind, message, expected):
    assert failure_report.whose(kind, kind(message)) == expected
