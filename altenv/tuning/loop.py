"""The tuning loop: agent proposals, cost-model top-k, measurement, budget stages.

ALT §5.2 and §7: the measured-trial budget is split between a joint stage (layouts and
loops explored together) and a loop-only stage (the best layout fixed); each proposed
batch (128 points by default) is ranked by the cost model and its top-k (8) measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from tqdm.auto import tqdm

from .budget import Budget
from .session import TuningSession
from .task import Candidate, Factors


class Agent(Protocol):
    """What the tuning loop asks of a search strategy. :class:`agents.base.Agent`
    implements it; the protocol lives here, below the agents, so that tuning never imports
    them."""

    def run(self, session: TuningSession, budget: Budget, batch: int, top_k: int,
            report: Callable[[TuningSession], None]) -> None:
        """Tune until the budget is spent, calling ``report(session)`` after measuring."""

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """A batch of up to ``n`` candidates (``layout``: fixed, in the loop-only stage)."""

    def choose(self, session: TuningSession, candidates: Sequence[Candidate], k: int
               ) -> list[Candidate]:
        """Which ``k`` of a proposed batch to measure."""

    def observe(self, candidates: Sequence[Candidate], latencies: Sequence[float]) -> None:
        """Measured median latencies (s, ``inf`` for failures) of proposed candidates."""


def tune(session: TuningSession, agent: Agent, budget: Budget, batch: int = 128,
         top_k: int = 8, progress: bool = True,
         callbacks: Sequence[Callable[[TuningSession], None]] = (),
         finalists: int = 8, finalist_rounds: int = 3, finalists_cold: bool = False,
         seconds: float | None = None) -> float:
    """Run ``agent`` on ``session`` until ``budget`` trials are measured, then re-time the
    ``finalists`` fastest side by side (:meth:`TuningSession.finalize`, ``0``: keep the
    fastest at tuning time; ``finalists_cold``: with their weights flushed from the CPU
    caches before each call); returns the best latency (s). Resumed sessions continue where
    their records stop; the session never measures past the budget. With ``seconds`` the
    trials also stop once the tuning, finalists included, would last longer than that
    (:attr:`TuningSession.out_of_time`). ``callbacks`` are called with the session after
    each measured batch (logging, checkpoints)."""
    session.limit = budget.total
    if finalists > 1:  # the finalists are built once and timed finalist_rounds times
        session.set_deadline(seconds, finalists, finalists * finalist_rounds)
    else:
        session.set_deadline(seconds)
    bar = tqdm(total=budget.total, initial=min(session.trials, budget.total),
               desc=session.task.key[:40], unit="trial", disable=not progress)
    done = [session.trials]

    def report(s: TuningSession) -> None:
        best = s.best[1]
        stage = "joint" if s.trials <= budget.joint else "loop"
        bar.set_postfix(stage=stage, best_ms=f"{best * 1e3:.4g}" if math.isfinite(best) else "-")
        bar.update(s.trials - done[0])
        done[0] = s.trials
        for callback in callbacks:
            callback(s)

    try:
        _run_timed(session, agent, budget, batch, top_k, report)
        bar.set_postfix(stage="finalists")
        session.finalize(finalists, finalist_rounds, finalists_cold)
    finally:
        bar.close()
    return session.best[1]


def _run_timed(session: TuningSession, agent: Agent, budget: Budget, batch: int, top_k: int,
               report: Callable[[TuningSession], None]) -> None:
    """``agent.run``, its time counted as the session's ``search`` less what the session
    counted as cost model and measurement meanwhile: whatever else an agent does
    (proposing, choosing, a policy's updates, schedules and checks of what it measures)
    is the search's own cost, however the agent drives the session."""
    named = ("cost_model", "measure_wall")
    start, before = time.perf_counter(), sum(session.seconds[k] for k in named)
    try:
        agent.run(session, budget, batch=batch, top_k=top_k, report=report)
    finally:
        session.seconds["search"] += (time.perf_counter() - start
                                      - (sum(session.seconds[k] for k in named) - before))


def propose_and_measure(session: TuningSession, agent: Agent, budget: Budget, batch: int,
                        top_k: int, report: Callable[[TuningSession], None],
                        max_stalls: int = 5) -> None:
    """The default agent loop: ask for a batch (a fixed best layout in the loop-only
    stage), measure what the agent chooses of it (by default the cost model's top-k),
    tell the agent. Gives up after
    ``max_stalls`` batches in a row that offer nothing new to measure."""
    stalls = 0
    while session.trials < budget.total and stalls < max_stalls and not session.out_of_time:
        best_cand, _ = session.best
        joint = session.trials < budget.joint or best_cand is None
        candidates = agent.propose(session, batch, None if joint else best_cand.factors)
        room = session.remaining  # what the limit and a deadline leave
        chosen = agent.choose(session, candidates, min(
            top_k, budget.total - session.trials, top_k if room is None else room))
        if not chosen:
            stalls += 1
            continue
        stalls = 0
        latencies = session.measure(chosen)
        agent.observe(chosen, latencies)
        report(session)
