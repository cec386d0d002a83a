"""Warm starts between the tasks of a network that compute the same operator.

A network calls one operator shape with different fused epilogues: R3D-18's 512-channel
convolution with a bias, with bias and ReLU, with the residual add; ResNet-18's 3x3
convolutions with and without it. Each is its own task, tuned on its own share of the
budget. Before a task is tuned, the fastest candidates of its siblings tuned earlier in
the run are carried over (the same layout; each loop decision copied where the sibling's
design space samples the same thing, :meth:`altenv.space.LoopSpace.transfer`) and
measured first, as the start of its joint stage: a few trials of this task's budget, so
the comparison with other tuners stays at equal trials.

The first sibling tuned has nothing to start from, and a later one may find a much faster
candidate (ResNet-18's first 3x3 convolution with ReLU kept a planar output at 1.54 ms
while its sibling with the residual add reached 1.06 ms in a blocked layout): once the
last sibling is tuned, each earlier one measures the best of the siblings tuned after it
(:func:`carry_back`, trials reserved from its own share) and re-times its finalists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, OpTask


@dataclass(frozen=True)
class TunedTask:
    """A tuned task and its fastest candidates, fastest first, with their latencies (s)."""

    task: OpTask
    candidates: tuple[tuple[float, Candidate], ...]


def tuned_task(session: TuningSession, n: int) -> TunedTask:
    """``session``'s task with its best candidate (the re-timed winner) and its next
    fastest measured ones, ``n`` in all."""
    best, latency = session.best
    ranked = sorted(((lat, cand) for cand, lat in session.measured_items()
                     if math.isfinite(lat) and cand != best), key=lambda pair: pair[0])
    head = [(latency, best)] if best is not None else []
    return TunedTask(session.task, tuple(head + ranked)[:n])


def warm_start(task: OpTask, siblings: Sequence[TunedTask], n: int) -> list[Candidate]:
    """Up to ``n`` candidates of ``task`` carried over from ``siblings`` (tasks of the same
    operator, other epilogues): every sibling's best first (the fastest sibling's first),
    then their second fastest, and so on (a best's re-timed latency does not compare with
    the others' tuning-time ones); a candidate whose decisions do not replay on ``task``
    is skipped."""
    ranked = sorted(((rank, lat, sib.task, cand) for sib in siblings
                     for rank, (lat, cand) in enumerate(sib.candidates)),
                    key=lambda item: item[:2])
    out: list[Candidate] = []
    for _, _, source, cand in ranked:
        if len(out) >= n:
            break
        point = task.space(cand.factors).transfer(cand.point, source.space(cand.factors))
        if point is not None and Candidate(cand.factors, point) not in out:
            out.append(Candidate(cand.factors, point))
    return out


def carry_back(session: TuningSession, later: Sequence[TunedTask], n: int, limit: int,
               finalists: int, finalist_rounds: int = 3, finalists_cold: bool = False
               ) -> list[Candidate]:
    """Measure on ``session`` (its task tuned) up to ``n`` candidates carried over from
    ``later`` (siblings tuned after it) that it has not measured, with at most ``limit``
    trials in all, then re-time its finalists (:meth:`TuningSession.finalize`); returns
    the candidates it carried over (those past ``limit`` unmeasured). Called again (a
    resumed run), it measures no candidate twice."""
    pool = warm_start(session.task, later, sum(len(sib.candidates) for sib in later))
    carried = [c for c in pool if session.measured(c) is None][:n]
    session.limit = limit
    session.measure(carried)
    session.finalize(finalists, finalist_rounds, finalists_cold)
    return carried
