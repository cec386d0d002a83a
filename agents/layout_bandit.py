"""Which layout gets the next turn of a loop-only stage: a UCB bandit over layouts.

A race that halves its entrants after a batch or two drops a layout on the luck of a few
loop samples (the best of heldout c2d_1's 16-channel blocked layout's first 8 trials was
27.9 ms in one seed, 4.8 ms in two others), and a stage that then gives every trial to the
winner cannot come back when the winner's loop search stalls (altenv's 1000-trial run of
a 24-to-40-channel convolution settled on the untiled layout and ended slower than its own
200-trial run). Here every turn is a decision: each layout's index is how far its best
trial is behind the best of all (``log`` of the ratio, so that 2x behind counts the same at
any speed) plus a UCB1 bonus that shrinks with the trials the layout has had, so a layout
is set aside only as its own trials add up, and one that stalls loses turns to the rest.
Every layout first gets one turn, as in a race's first round (offline, on cpu-v0's
dep-000, a layout 1.58x behind the best after the joint stage was 1.25x behind after its
first 8 trials of the loop stage, and ahead after 16). The framework layout (the one
MetaSchedule tunes) keeps a floor share of the stage.

The decision follows from the records alone (their layouts and latencies, in order), so a
killed run resumes where it stopped.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from altenv.tuning.task import Factors


def arms(items: Sequence[tuple[Factors, float]], joint: int, count: int,
         framework: Factors) -> list[Factors]:
    """The layouts the bandit plays: the ``count`` best (by best measured latency) of the
    first ``joint`` records, and the framework layout if it has a finite trial among them."""
    best: dict[Factors, float] = {}
    for factors, latency in items[:joint]:
        best[factors] = min(best.get(factors, math.inf), latency)
    ran = sorted((f for f in best if math.isfinite(best[f])), key=best.get)
    chosen = ran[:count]
    if framework in ran and framework not in chosen:
        chosen.append(framework)
    return chosen


def next_turn(items: Sequence[tuple[Factors, float]], joint: int, count: int, turn: int,
              framework: Factors, share: float, exploration: float,
              exhausted: Collection[Factors] = ()) -> tuple[Factors, int] | None:
    """The layout of the next loop-only trials and how many of them its turn has left.

    ``items`` are the session's measured (layout, latency) pairs in order, the first
    ``joint`` of them the joint stage's; ``count`` layouts of it are played (see
    :func:`arms`), ``turn`` trials at a time. A turn goes on while the latest records'
    run of one layout is not a multiple of ``turn`` long. A new turn goes to a layout that
    has had none in the stage (in the order of :func:`arms`: a race's first round, since a
    layout's joint-stage trials were picked by a cost model that knew little of it), then
    to the framework layout while it has had less than ``share`` of the stage's trials,
    else to the layout of highest
    ``log(best of all / its best) + exploration * sqrt(log(trials) / its trials)``
    (trials and bests over all records of the played layouts; a tie to the faster).
    Layouts in ``exhausted`` (nothing new left to measure) are passed over. ``None``: fewer
    than two layouts to play, or every one exhausted.
    """
    played = arms(items, joint, count, framework)
    if len(played) < 2:
        return None
    loop = items[joint:]
    if loop:
        last, run = loop[-1][0], 0
        for factors, _ in reversed(loop):
            if factors != last:
                break
            run += 1
        if last in played and last not in exhausted and run % turn:
            return last, turn - run % turn
    open_ = [f for f in played if f not in exhausted]
    if not open_:
        return None
    new = [f for f in open_ if all(g != f for g, _ in loop)]
    if new:  # every layout's first turn in the stage, as a race's first round
        return new[0], turn
    if framework in open_ and sum(f == framework for f, _ in loop) < share * len(loop):
        return framework, turn
    trials = dict.fromkeys(played, 0)
    best = dict.fromkeys(played, math.inf)
    for factors, latency in items:
        if factors in trials:
            trials[factors] += 1
            best[factors] = min(best[factors], latency)
    leader = min(best.values())
    total = math.log(sum(trials.values()))

    def index(factors: Factors) -> tuple[float, float]:
        gap = math.log(leader / best[factors])
        return gap + exploration * math.sqrt(total / trials[factors]), -best[factors]

    return max(open_, key=index), turn
