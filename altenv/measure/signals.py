"""Worker processes that leave Ctrl-C to the process that owns them.

Ctrl-C at a terminal sends SIGINT to the whole foreground process group: every builder and
runner worker would die with a traceback of its own (and a candidate being timed would be
recorded as failed), while the main process, which owns them, prints one line, shuts them
down and leaves its records to resume from. A process starts with the signal mask of the
thread that started it, and keeps it across ``exec``; so the worker pools start their
processes from threads that block SIGINT (:func:`altenv.measure.pool.worker_pool`). The
main thread never blocks it for longer than a pool's construction, so Ctrl-C still
reaches it.

Inside the main process, a ``KeyboardInterrupt`` raised in a Python callback that C++ code
called (MetaSchedule's search ranking candidates with a Python cost model) crosses C++
frames that cannot unwind it and aborts the process; :func:`sigint_deferred` holds Ctrl-C
back around such calls and raises it after them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


def block_sigint() -> None:
    """Block SIGINT in the calling thread (and so in the processes it starts)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


@contextlib.contextmanager
def sigint_blocked() -> Iterator[None]:
    """SIGINT blocked in this thread for the block: threads and processes started inside
    it keep it blocked (a SIGINT that arrives meanwhile is delivered at the end)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Ctrl-C noted, not raised, during the block, then handed to the handler that was in
    place before it (in the main thread; elsewhere Python delivers no signal anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(*caught[0])
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt


def exit_on_sigint() -> None:
    """In a worker process started with SIGINT blocked: exit quietly (status 130) on
    Ctrl-C from now on (a SIGINT already pending arrives at once)."""
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
