"""The measurers' worker pools: MetaSchedule's ``PopenPoolExecutor``, whose processes start
without PyTorch and leave Ctrl-C to the process that owns them, and a ``LocalRunner`` on
one.

A worker runs ``python -m tvm.exec.popen_worker``; importing ``tvm`` imports ``tvm_ffi``,
which imports PyTorch whenever it is installed (altenv installs it for its frontends and
baselines), though no build or timing in a worker uses it: 3.4 s of the 5.3 s a worker took
to start on a 2-core host, then 6.0 s against 1.9 s with a builder's preloads. Builder
and runner workers start with every measurer, again after each crash, timeout or
recycling, so the pools here start theirs with ``torch`` marked absent (``import torch`` raises
``ImportError``, which ``tvm_ffi`` expects) and the same worker entry point otherwise, and
fork them from a process that has done those imports once (:mod:`altenv.measure.zygote`).
Signals: :mod:`altenv.measure.signals`.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import LocalRunner
from tvm.support.popen_pool import PopenPoolExecutor, PopenWorker

from .config import DEFAULT_PRELOAD
from .signals import block_sigint
from .zygote import popen

RUNNER_MAX_USES = 256
"""Candidates a runner worker times before it is replaced: every module it loads stays
mapped in it (a dataset collection's runner held 15 GB after 6,000 programs)."""

#: What a worker imports once, in its zygote: TVM's worker loop and a builder's default
#: preloads.
WORKER_PRELOAD = ("tvm.exec.popen_worker", *DEFAULT_PRELOAD)


class LeanWorker(PopenWorker):
    """TVM's ``PopenWorker`` whose process runs TVM's worker loop with PyTorch marked
    absent, forked by a zygote (:func:`altenv.measure.zygote.popen`; the same pipes and
    protocol)."""

    def _start(self) -> None:
        if self._proc is not None:
            return
        main_read, worker_write = os.pipe()
        worker_read, main_write = os.pipe()
        self._proc = popen("tvm.exec.popen_worker:main", WORKER_PRELOAD, without_torch=True,
                           fd_args=(worker_read, worker_write), stdout=self._stdout,
                           stderr=self._stderr)
        os.close(worker_read)
        os.close(worker_write)
        self._reader = os.fdopen(main_read, "rb")
        self._writer = os.fdopen(main_write, "wb")


def worker_pool(**options: object) -> PopenPoolExecutor:
    """A ``PopenPoolExecutor`` (``options`` as it takes them) of :class:`LeanWorker`
    processes, each started (and restarted) with SIGINT blocked. The pool keeps one worker
    a thread; each of its threads puts a lean one in place before its first task."""
    pool = PopenPoolExecutor(**options)
    threads = pool._threadpool  # the threads that start the workers, none started yet
    pool._threadpool = ThreadPoolExecutor(threads._max_workers, initializer=_pool_thread,
                                          initargs=(pool,))
    threads.shutdown()
    return pool


def _pool_thread(pool: PopenPoolExecutor) -> None:
    """A pool thread's start: SIGINT blocked (see :mod:`altenv.measure.signals`), this
    thread's worker a :class:`LeanWorker`."""
    block_sigint()
    with pool._lock:
        pool._worker_map[threading.get_ident()] = LeanWorker(
            pool._initializer, pool._initargs, pool._maximum_process_uses, pool._stdout,
            pool._stderr)


@derived_object
class LeanLocalRunner(LocalRunner._cls):  # the Python class behind TVM's object
    """MetaSchedule's ``LocalRunner`` (same arguments) on a :func:`worker_pool`: its
    constructor makes a pool and checks it with a first task; the pool is swapped before
    that task starts a worker."""

    def _sanity_check(self) -> None:
        made = self.pool
        self.pool = worker_pool(max_workers=1, timeout=made._timeout,
                                initializer=made._initializer, stderr=made._stderr,
                                maximum_process_uses=RUNNER_MAX_USES)
        made.shutdown(wait=True)
        super()._sanity_check()
