"""Where committed state outlives the processes: one file per host, and
one per rank for state that differs between ranks.

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
# Each rank's own part of a commit (sharded optimizer state): one file per
# rank of the world that committed it, written by that rank.
PART_NAME = "state.part{}.pkl"


class CommitStore:
    """One host's copy of the last commit. One process per host (local rank
    0) writes the commit; every rank writes its own part of it, if it has
    one; every process may read."""

    def __init__(self, directory: str, writer: bool):
        self.directory = directory
        self.path = os.path.join(directory, FILE_NAME)
        self.writer = writer
        self._pending: threading.Thread | None = None
        self._pending_part: threading.Thread | None = None
        self._error: BaseException | None = None
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

    def write_part(self, commit: int, rank: int, part: Any) -> None:
        """Writes this rank's own ``part`` of commit number ``commit`` in the
        background (every rank writes its own, writer or not)."""
        if self._pending_part is not None:
            self._pending_part.join()
            self._pending_part = None
        path = os.path.join(self.directory, PART_NAME.format(rank))
        thread = threading.Thread(target=self._write_file, args=(path, commit, part),
                                  name="hora-elastic-part", daemon=True)
        self._pending_part = thread
        thread.start()

    def flush(self) -> None:
        """Waits for the writes in flight; raises the error one hit, if any."""
        for attribute in ("_pending", "_pending_part"):
            thread = getattr(self, attribute)
            if thread is not None:
                thread.join()
                setattr(self, attribute, None)
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"hora.elastic: writing the committed state to {self.path} "
                               f"failed: {error}") from error

    def _write(self, commit: int, snapshot: Any) -> None:
        self._write_file(self.path, commit, snapshot)

    def _write_file(self, path: str, commit: int, snapshot: Any) -> None:
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "wb") as f:
                f.write(_MAGIC + b"%020d\n" % commit)
                pickle.dump(snapshot, f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(temporary, path)
        except BaseException as error:  # reported by the next flush()
            self._error = error
            try:
                os.unlink(temporary)
            except OSError:
                pass

    def newest(self) -> int:
        """The commit number on this host's disk, or 0 when there is none."""
        return self._commit_of(self.path)

    def part_commit(self, rank: int) -> int:
        """The commit number of rank ``rank``'s part on this host's disk, or 0."""
        return self._commit_of(os.path.join(self.directory, PART_NAME.format(rank)))

    def load_part(self, rank: int) -> Any:
        """Rank ``rank``'s part, from this host's disk."""
        with open(os.path.join(self.directory, PART_NAME.format(rank)), "rb") as f:
            f.read(_HEADER_BYTES)
            return pickle.load(f)

    @staticmethod
    def _commit_of(path: str) -> int:
        try:
            with open(path, "rb") as f:
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
        self.flush()
        if self.writer:
            names = [FILE_NAME] + [name for name in os.listdir(self.directory)
                                   if name.startswith("state.part") and name.endswith(".pkl")]
            for name in names:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass
