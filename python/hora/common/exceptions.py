"""Exceptions raised by hora.

Argument errors found at the call site are plain ``ValueError`` / ``TypeError``.
Everything decided together with the other ranks raises a subclass of
:class:`HoraError`, which is a ``RuntimeError`` so existing handlers keep working.
"""


class HoraError(RuntimeError):
    """A collective failed; the message names the tensor and, where ranks
    disagree, the ranks on each side and their values."""


class HoraMismatchError(HoraError):
    """Ranks submitted the same collective name with different parameters
    (shape, dtype, op, root rank, scale factors or kind). Raised on every rank;
    the process stays usable."""


class HoraInternalError(HoraError):
    """The transport failed or a peer rank was lost. This is what elastic
    training catches to restart from the last good state."""


class HoraShutdownError(HoraError):
    """hora was shut down (on this rank or on a peer) while work was pending."""


class HoraTimeoutError(HoraError):
    """A stalled collective was aborted after the configured time."""


class HostsUpdatedInterrupt(RuntimeError):
    """Elastic training: horarun found hosts added or removed. Raised by
    ``state.commit()`` / ``state.check_host_updates()`` on every rank at the
    same point; ``hvd.elastic.run`` catches it and the world is re-formed
    from that commit. ``skip_sync`` is Horovod's flag for a change that
    needs no state sync."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the set of hosts changed; the world is re-formed at this commit")
        self.skip_sync = skip_sync


# Horovod's name, so `except hvd.HorovodInternalError` keeps working.
HorovodInternalError = HoraInternalError
