"""MetaSchedule's search strategy stopped at a wall-clock deadline.

MetaSchedule budgets trials, not time. To compare tuners at equal tuning time (``bench ops
--seconds N``), its strategy is wrapped: each iteration is cut to the candidates that the
time left should still measure at the pace of the iterations so far (the first, whose pace
is unknown, to a few), and once the deadline has come the strategy reports itself
finished, so that the task scheduler ends the task as it ends one whose space is exhausted.
"""

from __future__ import annotations

import math
import time

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.search_strategy import PySearchStrategy, SearchStrategy


@derived_object
class DeadlineSearch(PySearchStrategy):
    """``inner`` (a MetaSchedule search strategy) until ``deadline`` (``time.monotonic()``
    seconds)."""

    PROBE = 8
    """Candidates of the first iteration measured, before the pace is known (an
    iteration of 64 on two cores takes 20 to 40 s)."""

    def __init__(self, inner: SearchStrategy, deadline: float) -> None:
        self.inner, self.deadline = inner, deadline
        self._start = self._round_start = time.monotonic()
        self._trials = 0
        self._round_pace = 0.0  # seconds a trial of the latest iteration

    def _initialize_with_tune_context(self, context: ms.TuneContext) -> None:
        self.inner._initialize_with_tune_context(context)  # noqa: SLF001 (MetaSchedule's hook)

    def pre_tuning(self, max_trials, num_trials_per_iter, design_spaces, database=None,
                   cost_model=None) -> None:
        self._start, self._trials, self._round_pace = time.monotonic(), 0, 0.0
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database,
                              cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def generate_measure_candidates(self) -> list[ms.MeasureCandidate] | None:
        """The inner strategy's next iteration, cut to what the time left measures at the
        slower of the pace so far and the latest iteration's (the first iterations, before
        the cost model is trained, search least); ``None`` (finished) once the deadline
        has come."""
        now = self._round_start = time.monotonic()
        if now >= self.deadline:
            return None
        candidates = self.inner.generate_measure_candidates()
        if not candidates:
            return candidates
        if self._trials == 0:  # the pace is not known yet: measure a few to learn it
            return list(candidates)[:self.PROBE]
        pace = max((now - self._start) / self._trials, self._round_pace)
        fits = max(1, math.floor((self.deadline - time.monotonic()) / pace))
        return list(candidates)[:fits]

    def notify_runner_results(self, measure_candidates, results) -> None:
        self._trials += len(results)
        if results:
            self._round_pace = (time.monotonic() - self._round_start) / len(results)
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self) -> DeadlineSearch:
        return DeadlineSearch(self.inner.clone(), self.deadline)
