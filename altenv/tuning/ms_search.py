"""MetaSchedule's ``EvolutionarySearch`` over the loops of one layout of a session.

The loop stage of ALT's tuning (§5.2) with MetaSchedule's own search strategy: its
sampling of the design spaces, its mutators (tile size, compute location, unroll), its
genetic iterations and epsilon-greedy picks. Candidates are ranked by the session's cost
model (shared by every layout of the workload) and the search starts from the layout's
measured records. Each candidate is read back into a loop point, so the session
measures, checks and records it like any other. A measurer may set the search's threads
(``search_threads``: a replay sets one, so that a seeded cell repeats).
"""

from __future__ import annotations

import math
import time

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import RunnerResult

from ..costmodel import FAILED_COST, extract_features
from ..measure.signals import sigint_deferred
from .session import TuningSession
from .task import Candidate, Factors


@derived_object
class _SessionCostModel(ms.cost_model.PyCostModel):
    """The session's cost model behind MetaSchedule's cost-model interface (the session
    trains it on every measurement, so ``update`` is never asked for)."""

    def __init__(self, session: TuningSession) -> None:
        self.session = session

    def predict(self, context: ms.TuneContext, candidates: list[ms.MeasureCandidate]
                ) -> np.ndarray:
        start = time.perf_counter()
        feats = extract_features(context, [c.sch for c in candidates])
        scores = np.asarray(self.session.cost_model.predict(feats), dtype=np.float64)
        self.session.seconds["cost_model"] += time.perf_counter() - start
        return scores


class LayoutLoopSearch:
    """MetaSchedule's evolutionary search on the loop space of layout ``factors``.

    Parameters
    ----------
    session:
        The tuning session (cost model, records, measurement).
    factors:
        The layout whose loops are searched.
    seed:
        Seed of the search's tuning context.
    population:
        ``EvolutionarySearch`` population (MetaSchedule's default is 512; each generation
        costs time proportional to it).
    batch:
        Candidates per search iteration (MetaSchedule's ``num_trials_per_iter``).
    eps_greedy:
        Share of each iteration drawn at random from the initial population.
    """

    def __init__(self, session: TuningSession, factors: Factors, seed: int = 0,
                 population: int = 512, batch: int = 32, eps_greedy: float = 0.05):
        self.session, self.factors = session, factors
        self.space = session.task.space(factors)
        self.strategy = ms.search_strategy.EvolutionarySearch(
            population_size=population, eps_greedy=eps_greedy)
        context, design_spaces = self.space.search_context(
            self.strategy, seed, getattr(session.measurer, "search_threads", None))
        self._context = context  # kept as long as the strategy initialized with it
        self.database = ms.database.MemoryDatabase()
        self._workload = self.database.commit_workload(self.space.mod)
        # no trial limit here: the session enforces the budget
        with sigint_deferred():  # the strategy calls the cost model back from C++
            self.strategy.pre_tuning(1 << 30, batch, design_spaces, self.database,
                                     _SessionCostModel(session))
        self._committed: set[Candidate] = set()
        self._pending: list[tuple[ms.MeasureCandidate, Candidate | None]] = []

    def propose(self, n: int) -> list[Candidate]:
        """Up to ``n`` unmeasured candidates of the current search iteration, in the
        strategy's order; a new iteration starts once the current one is measured."""
        if not self._unmeasured():
            self._advance()
        return self._unmeasured()[:n]

    def _unmeasured(self) -> list[Candidate]:
        return [c for _, c in self._pending if c is not None and self.session.measured(c) is None]

    def _advance(self) -> None:
        """Report the finished iteration to the strategy, give its database every measured
        record of the layout, and generate the next iteration."""
        if self._pending:
            self.strategy.notify_runner_results(
                [mc for mc, _ in self._pending],
                [self._result(c) for _, c in self._pending])
        self._commit()
        with sigint_deferred():  # the search calls the cost model back from C++
            generated = self.strategy.generate_measure_candidates() or []
        self._pending = []
        for mc in generated:
            point = self.space.point_of(mc.sch)
            self._pending.append((mc, None if point is None else Candidate(self.factors, point)))

    def _result(self, candidate: Candidate | None) -> RunnerResult:
        latency = None if candidate is None else self.session.measured(candidate)
        if latency is None or not math.isfinite(latency):
            return RunnerResult(None, "not measured" if latency is None else "failed")
        return RunnerResult([latency], None)

    def _commit(self) -> None:
        """Measured records of the layout (the joint stage's and resumed ones included)
        into the strategy's database, where it draws its measured parents from."""
        for cand, latency in self.session.measured_items():
            if cand.factors != self.factors or cand in self._committed:
                continue
            self._committed.add(cand)
            sch = self.space.decode(cand.point)
            if sch is None:
                continue
            self.database.commit_tuning_record(ms.database.TuningRecord(
                sch.trace, self._workload,
                [latency if math.isfinite(latency) else FAILED_COST],
                self.space.target, ms.arg_info.ArgInfo.from_prim_func(sch.mod["main"])))
