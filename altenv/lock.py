"""One writer per directory: an exclusive ``flock`` on a lock file that holds the PID.

A second process that asks for a held lock is refused at once with a :class:`LockedError`
naming the holder's PID. The kernel releases a ``flock`` when its holder exits, however it
exits (``kill -9`` included), so the lock of a dead process is simply taken over: the file
left behind is only a label. The lock file is opened without following a link and must
be a regular file, so a ``.lock`` that points elsewhere is refused before anything is
written.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .errors import UserError
from .files import open_regular

LOCK_FILE = ".lock"
"""The lock file of a run directory."""


class LockedError(UserError):
    """Another live process holds the lock."""


class DirLock:
    """Exclusive lock of ``path`` (a lock file; its folder must exist) for ``what``
    (a phrase for messages, e.g. ``"run directory runs/x"``). Use as a context manager."""

    def __init__(self, path: str | Path, what: str) -> None:
        self.path = Path(path)
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> DirLock:
        fd = open_regular(self.path, os.O_RDWR | os.O_CREAT)  # never through a link
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LockedError(f"{self.what} is in use by process {holder} (lock file "
                              f"{self.path}); wait for it to finish or stop it, then run "
                              "again") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> DirLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
