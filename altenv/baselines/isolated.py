"""Contenders that run in a process of their own.

In a process that has run TVM kernels, PyTorch's OpenMP threads compete with TVM's
runtime threads and a small torch call can take milliseconds instead of microseconds
(measured here: a 16->32 channel 3x3 convolution at 0.13 ms alone, 6-17 ms right after
TVM kernels in the same process; ``TVM_THREAD_POOL_SPIN_COUNT=0`` removes that but adds
~20 us to every TVM call). PyTorch baselines therefore run in a worker process (with
OpenMP's default wait policy: ``OMP_WAIT_POLICY=PASSIVE`` made a 64-channel 3x3
convolution 1.5x slower here); the timing process asks the worker for blocks of calls
and the worker times them itself, so no inter-process latency enters the numbers. The
timing process lets its own thread pools park before each block
(:func:`~altenv.measure.timing.wait_for_idle_threads`), which ends torch's occasional
15x slowdowns; the worker does not wait likewise before it replies, as idle cores slow
the next program down on this VM (torch's depthwise 960-channel convolution in three
re-timings each: 0.46-0.71 ms with both processes waiting, 0.16-0.45 ms with the timer
alone, 0.11-0.19 ms with neither). Workers are forked by a zygote that imported PyTorch and
the baselines once and ran nothing (:mod:`altenv.measure.zygote`): no thread pool has
started in them, as in a fresh process, and they are ready in milliseconds instead of ~6
CPU-seconds.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time
import weakref
from collections.abc import Callable
from typing import IO, Any

import cloudpickle
import numpy as np
import torch

from ..measure.signals import sigint_blocked
from ..measure.timing import wait_for_idle_threads
from ..measure.zygote import Forked, popen

#: What a worker imports once, in its zygote (:mod:`altenv.measure.zygote`): this module
#: (and so PyTorch) and the modules whose setups run there.
WORKER_PRELOAD = ("altenv.baselines.isolated", "altenv.baselines.network",
                  "altenv.baselines.operator")

Setup = Callable[[], tuple[Callable[[], object], Callable[[], list[np.ndarray]]]]
"""Runs in the worker: returns ``(run, outputs)`` like a :class:`~altenv.baselines.Baseline`."""


def _send(stream: IO[bytes], message: Any) -> None:
    pickle.dump(message, stream)
    stream.flush()


def _serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """The worker's loop: set up from the first message, then answer commands."""
    payload, threads, path = pickle.load(inp)
    sys.path[:] = path  # classes pickled by reference import as in the parent
    try:
        torch.set_num_threads(threads)
        run, outputs = cloudpickle.loads(payload)()
    except Exception as err:  # reported to the parent, which raises it
        _send(out, (False, f"{type(err).__name__}: {err}"))
        return
    _send(out, (True, None))
    while True:
        try:
            command, arg = pickle.load(inp)
        except EOFError:
            return
        try:
            if command == "block":
                start = time.perf_counter()
                for _ in range(arg):
                    run()
                _send(out, (True, (time.perf_counter() - start) / arg))
            elif command == "outputs":
                _send(out, (True, outputs()))
            else:
                return
        except Exception as err:
            _send(out, (False, f"{type(err).__name__}: {err}"))


def _stop(process: subprocess.Popen | Forked) -> None:
    try:
        _send(process.stdin, ("close", None))
    except (OSError, ValueError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class IsolatedRun:
    """``setup`` (pickled with cloudpickle) called in a fresh Python process with
    ``threads`` torch threads; :meth:`run`, :meth:`outputs` and :meth:`block` drive it.
    The worker stops when this object is closed or collected."""

    def __init__(self, setup: Setup, threads: int):
        with sigint_blocked():  # Ctrl-C is for this process, which stops the worker
            self._process = popen("altenv.baselines.isolated:main", WORKER_PRELOAD,
                                  without_torch=False, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE)
        self._finalizer = weakref.finalize(self, _stop, self._process)
        _send(self._process.stdin, (cloudpickle.dumps(setup), threads, list(sys.path)))
        self._reply()

    def _reply(self) -> Any:
        try:
            ok, value = pickle.load(self._process.stdout)
        except EOFError:
            raise RuntimeError("isolated baseline: the worker process died (its error is "
                               "on stderr)") from None
        if not ok:
            raise RuntimeError(f"isolated baseline: {value}")
        return value

    def _call(self, command: str, arg: Any = None) -> Any:
        _send(self._process.stdin, (command, arg))
        return self._reply()

    def block(self, inner: int) -> float:
        """Seconds per call over ``inner`` back-to-back calls, timed in the worker once this
        process's threads are idle (the worker gets the cores to itself)."""
        wait_for_idle_threads()
        return self._call("block", inner)

    def run(self) -> None:
        """One call."""
        self._call("block", 1)

    def outputs(self) -> list[np.ndarray]:
        """The outputs of the latest call."""
        return self._call("outputs")

    def close(self) -> None:
        """Stop the worker."""
        self._finalizer()


def main() -> None:
    """The worker process's entry point. The protocol owns the real stdout; anything the
    setup prints goes to stderr."""
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _serve(sys.stdin.buffer, protocol)
