"""Handles on collectives in flight, shared by the NumPy face and every
adapter, and :func:`wait_all` for waiting on several of them."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Callable


class Handle:
    """A collective in flight. Pass it to :func:`poll` or :func:`synchronize`."""

    __slots__ = ("_works", "_finish", "_result", "_error", "_done")

    def __init__(self, works: Sequence[Any], finish: Callable[[Sequence[Any]], Any]) -> None:
        self._works = works
        self._finish = finish
        self._done = False
        self._result = None
        self._error: BaseException | None = None

    def _wait(self) -> Any:
        if not self._done:
            try:
                # a failed member does not end the wait: the rest of its
                # group fails or finishes with it, and is seen here too
                failed = None
                for work in self._works:
                    try:
                        work.wait()
                    except BaseException as error:
                        if not work.poll():
                            raise  # interrupted: this member is still running
                        failed = failed or error
                if failed is not None:
                    raise failed
                self._result = self._finish(self._works)
            except BaseException as error:
                if not self._settled():
                    # interrupted (Ctrl-C, a signal handler): the collective
                    # is still in flight and this handle can be waited on again
                    raise
                self._error = error
            finally:
                if self._settled():
                    for work in self._works:
                        work.release()
                    self._done = True
        if self._error is not None:
            raise self._error
        return self._result

    def _settled(self) -> bool:
        return all(work.poll() for work in self._works)

    def _poll(self) -> bool:
        return self._done or all(work.poll() for work in self._works)


class CallableHandle(Handle):
    """A handle that is also called for its result: Horovod's
    ``sparse_allreduce_async`` returns a function, so ``handle()`` works
    here as well as ``synchronize(handle)``."""

    __slots__ = ()

    def __call__(self) -> Any:
        return self._wait()


class OneHandle(Handle):
    """A handle on one core Work whose result object is known when it is
    submitted (an in-place collective, or one into a caller's output): the
    per-gradient path, without a list or a finishing closure. ``_works``
    holds that one Work itself."""

    __slots__ = ()

    def __init__(self, work: Any, result: Any) -> None:
        # Handle's slots, holding one Work and no closure here
        self._works = work
        self._finish = None  # type: ignore[assignment]
        self._result = result
        self._done = False
        self._error = None

    def _wait(self) -> Any:
        if not self._done:
            work: Any = self._works
            try:
                work.wait_release()  # gives up the GIL while it waits
            except BaseException as error:
                if not work.poll():
                    raise  # interrupted: still in flight, can be waited on again
                self._error = error
            # only now: another thread polling meanwhile must not see the
            # result as ready while the engine still writes it
            self._done = True
        if self._error is not None:
            raise self._error
        return self._result

    def _poll(self) -> bool:
        work: Any = self._works
        return self._done or work.poll()


class DoneHandle(Handle):
    """A collective whose result was there when it was started: what the
    ``*_async`` calls return in code that ``torch.compile`` traces, where the
    collective is an operator in the graph (which runs it in order)."""

    def __init__(self, result: Any) -> None:  # noqa: D107 - no works to wait for
        super().__init__((), lambda works: result)
        self._result = result
        self._done = True


def poll(handle: Handle) -> bool:
    """True once the collective behind ``handle`` has finished (never blocks)."""
    return handle._poll()


def wait_for(handle: Handle, seconds: float) -> bool:
    """Waits at most ``seconds`` for ``handle``; True once it has finished
    (its result or error is then taken with :func:`synchronize`)."""
    if handle._poll():
        return True
    deadline = time.monotonic() + seconds
    for work in handle._works:
        if not work.wait_for(max(0.0, deadline - time.monotonic())):
            return False
    return True


def synchronize(handle: Handle) -> Any:
    """Waits for ``handle`` and returns its result; raises the collective's error."""
    return handle._wait()


def wait_all(handles: Iterable[Handle]) -> list[Any]:
    """The results of every handle, in order. When one fails, the others
    are still waited for before its error is raised (the first one, if
    several fail): the engine may otherwise still be writing into tensors
    the caller is about to reuse or free."""
    results: list[Any] = []
    first_error: BaseException | None = None
    for handle in handles:
        try:
            results.append(handle._wait())
        except BaseException as error:  # raised once all are done
            if not handle._poll():
                raise  # an interrupted wait ends at once
            results.append(None)
            if first_error is None:
                first_error = error
    if first_error is not None:
        raise first_error
    return results
