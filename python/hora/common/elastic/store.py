"""Where committed state outlives the processes: one file per host.

``commit()`` hands a snapshot (already copied, so training may go on
changing the live objects) to a background thread that pickles it into
``<dir>/state.pkl`` through a temporary file and an atomic rename, so a
process killed mid-write leaves the previous commit whole. The file starts
with a fixed-size header holding the commit number, which a new world reads
to find the newest commit without unpickling anything.
"""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any

_MAGIC = b"hora-elastic-state v1 commit="
_HEADER_BYTES = len(_MAGIC) + 21  # 20 digits and a newline
FILE_NAME = "state.pkl"


class CommitStore:
    """One host's copy of the last commit. Only one process per host writes
    (local rank 0); every process may read."""

    def __init__(self, directory: str, writer: bool):
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self.writer = writer
        self._pending: threading.Thread | None = None
        self._error: BaseException | None = None
        if writer:
            os.makedirs(directory, exist_ok=True)

    def write(self, commit: int, snapshot: Any) -> None:
        """Writes ``snapshot`` as commit number ``commit`` in the background.
        Waits for the previous write first, so the file is never more than
        one commit behind."""
        if not self.writer:
            return
        self.flush()
        thread = threading.Thread(target=self._write, args=(commit, snapshot),
                                  name="hora-elastic-commit", daemon=True)
        self._pending = thread
        thread.start()

    def flush(self) -> None:
        """Waits for the write in flight; raises the error it hit, if any."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"hora.elastic: writing the committed state to {self.path} "
                               f"failed: {error}") from error

    def _write(self, commit: int, snapshot: Any) -> None:
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "wb") as f:
                f.write(_MAGIC + b"%020d\n" % commit)
                pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, self.path)
        except BaseException as error:  # reported by the next flush()
            self._error = error
            try:
                os.unlink(temporary)
            except OSError:
                pass

    def newest(self) -> int:
        """The commit number on this host's disk, or 0 when there is none."""
        try:
            with open(self.path, "rb") as f:
                header = f.read(_HEADER_BYTES)
        except OSError:
            return 0
        if not header.startswith(_MAGIC) or len(header) != _HEADER_BYTES:
            return 0
        try:
            return int(header[len(_MAGIC):-1])
        except ValueError:
            return 0

    def load(self) -> tuple[int, Any]:
        """(commit number, snapshot) from this host's disk."""
        with open(self.path, "rb") as f:
            header = f.read(_HEADER_BYTES)
            return int(header[len(_MAGIC):-1]), pickle.load(f)

    def clear(self) -> None:
        """Forgets the commit (the training finished): the next launch of
        the same command starts afresh."""
        if self.writer:
            self.flush()
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
