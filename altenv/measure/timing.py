"""Side-by-side timing: callables are run interleaved (A B C A B C ...) so that load changes on
a shared machine hit every contender alike; each gets a median and a spread.

Every comparison times this way: the baselines against altenv, a network's layout choices
(:mod:`altenv.graph.in_network`, :mod:`altenv.graph.read_through`) and its kernels alone
(:mod:`altenv.graph.kernels`), so it lives below all of them."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

NOISY_SPREAD = 0.25
"""A timing whose :attr:`TimingStats.spread` (interquartile range over median) is above
this is too spread to trust: the middle half of its rounds differ by more than a quarter of
its median, so a ratio built on it can move that much when timed again (a busy host; 92 %
of the tuned programs in docs/results stay below it)."""


@dataclass(frozen=True)
class TimingStats:
    """Seconds per call of one callable over the rounds of :func:`time_interleaved`.

    Parameters
    ----------
    samples : tuple[float, ...]
        One value per round: the mean seconds per call of that round's block of calls.
    inner : int
        Calls per block.
    """

    samples: tuple[float, ...]
    inner: int

    @property
    def median(self) -> float:
        """Median seconds per call."""
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        """Fastest round."""
        return min(self.samples)

    @property
    def max(self) -> float:
        """Slowest round."""
        return max(self.samples)

    @property
    def iqr(self) -> tuple[float, float]:
        """First and third quartiles (equal to the sample for one round)."""
        if len(self.samples) < 2:
            return (self.samples[0], self.samples[0])
        q1, _, q3 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return (q1, q3)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        q1, q3 = self.iqr
        return (q3 - q1) / self.median if self.median > 0 else 0.0

    @property
    def noisy(self) -> bool:
        """Whether :attr:`spread` is above :data:`NOISY_SPREAD` (too spread to trust)."""
        return self.spread > NOISY_SPREAD

    def summary(self) -> dict[str, float | bool]:
        """Median, min, max (seconds), spread and ``noisy``, as runs and benches store them."""
        return {"median_s": self.median, "min_s": self.min, "max_s": self.max,
                "spread": self.spread, "noisy": self.noisy}


def summaries(stats: Mapping[str, TimingStats]) -> dict[str, dict[str, float | bool]]:
    """:meth:`TimingStats.summary` of each contender, as ``summary.json`` and a bench's
    ``timing.json`` store them."""
    return {name: st.summary() for name, st in stats.items()}


class BlockTimer(Protocol):
    """A contender that times its own blocks of calls (e.g. in another process, which then
    waits for this process's threads to park before each block: :func:`wait_for_idle_threads`;
    a contender on this process's own TVM thread pool has nothing to wait for)."""

    def block(self, inner: int) -> float:
        """Seconds per call over ``inner`` back-to-back calls."""


def wait_for_idle_threads(limit: float = 0.5, window: float = 0.005) -> float:
    """Sleep until this process's other threads stop using the CPU (under a tenth of a core
    over ``window`` seconds), at most ``limit`` seconds; returns the seconds waited.

    TVM's pool threads spin for about 150 ms after every parallel call (measured here), so a
    program in another process started within that time shares its cores with them: a torch
    worker timed 10 ms after a TVM call ran at 38-44 ms instead of 2.5-3.5 ms in about a
    quarter of the runs (24 ms instead of 0.2 ms for a small 1-d convolution).
    """
    start = time.perf_counter()
    others = time.process_time_ns() - time.thread_time_ns()
    while time.perf_counter() - start < limit:
        time.sleep(window)
        now = time.process_time_ns() - time.thread_time_ns()
        if now - others < 0.1 * window * 1e9:
            break
        others = now
    return time.perf_counter() - start


def _block(fn: Callable[[], object] | BlockTimer, inner: int) -> float:
    if not callable(fn):
        return fn.block(inner)
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def time_interleaved(
    runs: Mapping[str, Callable[[], object] | BlockTimer],
    rounds: int = 10,
    inner: int | None = None,
    min_block_seconds: float = 0.02,
    warmup: int = 2,
    cooldown_seconds: float = 0.01,
) -> dict[str, TimingStats]:
    """Time each callable of ``runs`` (each runs its program once, synchronously; a
    :class:`BlockTimer` instead times whole blocks itself).

    Every callable is first called ``warmup`` times; then for ``rounds`` rounds each one in
    turn runs a block of ``inner`` calls (the order rotates every round, so no callable
    always follows the same one). With ``inner=None`` a callable's block size is
    chosen from its warm-up so that one block lasts about ``min_block_seconds``. Between
    blocks the timer sleeps ``cooldown_seconds``: thread pools spin for a while after a
    parallel region (TVM's and torch's OpenMP alike) and would steal cores from the next
    contender; the pause lets them park.
    """
    if rounds < 1 or warmup < 1:
        raise ValueError(f"rounds and warmup must be >= 1, got {rounds}, {warmup}")
    inners: dict[str, int] = {}
    for name, fn in runs.items():
        time.sleep(cooldown_seconds)
        estimate = min(_block(fn, 1) for _ in range(warmup))
        inners[name] = inner or max(1, math.ceil(min_block_seconds / max(estimate, 1e-9)))
    samples: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            time.sleep(cooldown_seconds)
            samples[name].append(_block(runs[name], inners[name]))
    return {name: TimingStats(tuple(samples[name]), inners[name]) for name in runs}
