"""Exceptions raised by hora.

Argument errors found at the call site are ``ValueError`` / ``TypeError``
(the core's are :class:`HoraInvalidArgumentError` / :class:`HoraTypeError`,
which Horovod's handlers catch too). Everything decided together with the
other ranks raises a subclass of :class:`HoraError`, which is a
``RuntimeError`` so existing handlers keep working.
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


class HoraInvalidArgumentError(ValueError, RuntimeError):
    """A collective's arguments are wrong or unsupported (a name already in
    flight, an op the collective cannot do, bad splits). A ``ValueError``;
    also a ``RuntimeError``, the class Horovod raises for some of these
    (an unsupported op such as Adasum for reducescatter)."""


class HoraTypeError(TypeError, ValueError):
    """An argument of the wrong type (an unsupported dtype, splits that are
    not integers). A ``TypeError``; also a ``ValueError``, which Horovod
    raises for the same mistakes."""


class HoraUsageError(RuntimeError, AssertionError):
    """A call in the wrong order (``zero_grad()`` while gradients are being
    reduced, more backward passes than ``backward_passes_per_step``). Also
    an ``AssertionError``, as Horovod raises."""


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
