"""Fork servers for the worker processes altenv starts by the dozen.

Every builder and runner worker is a Python process that imports TVM before it takes a
task (about 2 CPU-seconds on a 2-core host), and a PyTorch baseline's worker imports
PyTorch and TVM (about 6): paid again whenever a worker is recycled (``builder_max_uses``),
killed after a timeout or a crash, or a new measurer or baseline starts. A zygote imports
what its workers need once and forks each worker from itself on request: the worker is
ready in milliseconds and runs the same entry point on the same pipes as a worker started
on its own, so TVM's worker pools, their protocol and their timeouts are unchanged.

One zygote per process and set of imports (started with its first worker, SIGINT blocked
as the workers are: :mod:`altenv.measure.signals`; it exits when its socket closes, that
is, with the process). Each request carries the requester's working directory and
environment, which the worker takes before it runs (a ``TVM_NUM_THREADS`` set later still
reaches it; a variable a library reads when it is imported, such as OpenMP's ``OMP_*``,
keeps the value it had when the zygote started). A zygote runs nothing but imports before
it forks, so no thread pool (TVM's, OpenMP's) has started in it. Python's
``multiprocessing`` fork server is not used: it is one server per process whose preloads
and signal set-up all its users share, and its workers start as pickled ``Process``
objects rather than on pipes a caller hands over.

Linux only (descriptors passed over a Unix socket; workers, the zygote's children rather
than the requester's, watched through process descriptors); elsewhere, or if a zygote
cannot start, :func:`popen` starts the worker as a process of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import IO, Any

from .signals import sigint_blocked

#: Prepended to a lean process's code: ``import torch`` raises ``ImportError``, which
#: ``tvm_ffi`` (imported by ``tvm``) expects, instead of taking ~3 s (:mod:`.pool`).
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None; "

_MAX_REQUEST = 1 << 20  # bytes: an entry point, a working directory and an environment


def serve() -> None:
    """A zygote's main: import the modules named in ``argv[-1]`` (comma-separated), then
    for each request on socket ``argv[-2]`` fork a worker and answer its process id;
    return when the requester closes the socket."""
    for name in filter(None, sys.argv[-1].split(",")):
        importlib.import_module(name)
    sock = socket.socket(fileno=int(sys.argv[-2]))
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, _MAX_REQUEST, 8)
        except OSError:
            return
        if not message:
            return
        pid = os.fork()
        if pid == 0:
            _worker(sock, json.loads(message), fds)
        for each in fds:
            os.close(each)
        sock.sendall(struct.pack("<q", pid))


def _reap(signum: int, frame: Any) -> None:
    """Reap the workers that exited, so that their CPU time is added to this zygote's
    children's: a collection counts its own process tree's time from those totals
    (:class:`altenv.dataset.collect.OtherLoad`), and a worker the kernel reaped itself (with
    ``SIGCHLD`` ignored) would take its time with it, to be counted as another process's."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _worker(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In a forked worker: take the requester's directory, environment and standard
    streams, then run the entry point; never returns."""
    code = 1
    try:
        sock.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        with contextlib.suppress(OSError):  # a directory since removed: stay where we are
            os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        # a PYTHONPATH set since the zygote started: its folders come first, as at start-up
        sys.path[1:1] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                         if p and p not in sys.path]
        args = fds[:request["fd_args"]]
        given = iter(fds[request["fd_args"]:])
        for target, how in enumerate(request["stdio"]):
            if how == "devnull":
                replacement = os.open(os.devnull, os.O_RDONLY if target == 0 else os.O_WRONLY)
            elif how == "fd":
                replacement = next(given)
            else:
                continue
            os.dup2(replacement, target)
            os.close(replacement)
        sys.argv = ["-c", *map(str, args)]
        module, _, function = request["entry"].partition(":")
        getattr(importlib.import_module(module), function)()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(code)


class Forked:
    """The part of ``subprocess.Popen`` that altenv's callers use (``pid``, ``stdin``,
    ``stdout``, ``poll``, ``wait``, ``kill``) for a worker a zygote forked: the zygote's
    child, so it is watched and signalled through a process descriptor, not ``waitpid``
    (its exit status is the zygote's: ``returncode`` is -1 once it has ended)."""

    def __init__(self, pid: int, stdin: IO[bytes] | None, stdout: IO[bytes] | None) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:  # already gone
            self._fd, self.returncode = None, -1

    def poll(self) -> int | None:
        """``None`` while the worker runs."""
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the worker to end; ``subprocess.TimeoutExpired`` after ``timeout``."""
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0)
        return code

    def kill(self) -> None:
        """SIGKILL, unless it has ended."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._fd, signal.SIGKILL)

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if ready:
                self.returncode = -1
                self._close()
        return self.returncode

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self._close()


class Zygote:
    """This process's end of a zygote that has imported ``preload`` (``torch`` marked
    absent first if ``without_torch``)."""

    def __init__(self, preload: Sequence[str], without_torch: bool) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = (WITHOUT_TORCH if without_torch else "") + \
            "from altenv.measure.zygote import serve; serve()"
        with sigint_blocked():
            self.process = subprocess.Popen(
                [sys.executable, "-c", code, str(theirs.fileno()), ",".join(preload)],
                pass_fds=(theirs.fileno(),))
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()

    def fork(self, entry: str, fd_args: Sequence[int], stdin: Any, stdout: Any,
             stderr: Any) -> Forked:
        """A worker running ``entry`` (``module:function``) with these descriptors as its
        arguments and the standard streams as ``subprocess.Popen`` takes them (``None``,
        ``PIPE`` for stdin and stdout, ``DEVNULL``, a descriptor, a file); ``OSError`` if
        the zygote is gone."""
        fds, stdio, ours, theirs = list(fd_args), [], {}, []
        for index, stream in enumerate((stdin, stdout, stderr)):
            if stream is None:
                stdio.append("inherit")
            elif stream == subprocess.DEVNULL:
                stdio.append("devnull")
            else:
                stdio.append("fd")
                if stream == subprocess.PIPE:
                    read, write = os.pipe()
                    ours[index] = os.fdopen(write if index == 0 else read, "wb" if index == 0
                                            else "rb")
                    stream = read if index == 0 else write
                    theirs.append(stream)
                fds.append(stream if isinstance(stream, int) else stream.fileno())
        request = {"entry": entry, "fd_args": len(fd_args), "stdio": stdio,
                   "cwd": os.getcwd(), "env": dict(os.environ)}
        try:
            with self._lock:
                socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
                answer = self._sock.recv(8)
        except OSError:
            for stream in ours.values():
                stream.close()
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        if len(answer) != 8:
            raise OSError("the zygote exited")
        return Forked(struct.unpack("<q", answer)[0], ours.get(0), ours.get(1))


_zygotes: dict[tuple[int, tuple[str, ...], bool], Zygote] = {}
_zygotes_lock = threading.Lock()


def zygote(preload: Sequence[str], without_torch: bool) -> Zygote | None:
    """This process's zygote for these imports, started on first use; ``None`` where there
    can be none (not Linux, or it failed to start)."""
    if not sys.platform.startswith("linux"):
        return None
    # a forked copy of this process starts zygotes of its own
    key = (os.getpid(), tuple(preload), without_torch)
    with _zygotes_lock:
        made = _zygotes.get(key)
        if made is not None and made.process.poll() is not None:
            made = None  # died: the next worker starts another
        if made is None:
            try:
                made = _zygotes[key] = Zygote(preload, without_torch)
            except OSError:
                return None
        return made


def popen(entry: str, preload: Sequence[str], without_torch: bool, fd_args: Sequence[int] = (),
          stdin: Any = None, stdout: Any = None, stderr: Any = None) -> Forked | subprocess.Popen:
    """A worker process running ``entry`` (``module:function``) with ``fd_args`` (open
    descriptors) as its arguments: forked by the zygote for ``preload`` and
    ``without_torch``, or, where none can fork it, started as
    ``python -c 'from module import function; function()' *fd_args``."""
    made = zygote(preload, without_torch)
    if made is not None:
        try:
            return made.fork(entry, fd_args, stdin, stdout, stderr)
        except OSError:
            pass
    module, _, function = entry.partition(":")
    code = f"from {module} import {function}; {function}()"
    return subprocess.Popen(
        [sys.executable, "-c", (WITHOUT_TORCH if without_torch else "") + code,
         *map(str, fd_args)], pass_fds=fd_args, stdin=stdin, stdout=stdout, stderr=stderr)
