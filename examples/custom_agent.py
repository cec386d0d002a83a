"""A user-written agent: a greedy hill climber around the best measured candidate.

Nothing here is registered with altenv; a config names the class by module path::

    agent: custom_agent:HillClimber        # or {name: custom_agent:HillClimber, options: {...}}

and the module must be importable, e.g. from the repository root::

    PYTHONPATH=examples altenv tune examples/custom_agent.yaml

Each batch holds neighbours of the fastest candidate measured so far (``session.best``):
a neighbour is ``radius`` single-subspace moves (``LoopSpace.move``) away from it. The
radius doubles after a batch that brought no improvement and drops back to 1 after one
that did (``observe``). In the joint stage (``layout is None``) part of each batch is
loop points of a fresh random layout (``task.random_factors``), so the layout is explored
too; the loop-only stage gets the fixed best layout. Whatever the neighbourhood cannot
fill (small spaces, or nothing measured yet) is filled by MetaSchedule's sampling.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from agents import Agent
from altenv.space import LoopPoint, LoopSpace
from altenv.tuning import Candidate, TuningSession
from altenv.tuning.task import Factors


class HillClimber(Agent):
    """Greedy local search with an adaptive radius.

    Parameters
    ----------
    seed:
        Seed of the moves and of the random layouts (the run's ``seed`` by default).
    max_radius:
        Largest number of moves between the best candidate and a neighbour.
    explore:
        Fraction of a joint-stage batch given to a fresh random layout.
    """

    def __init__(self, seed: int = 0, max_radius: int = 8, explore: float = 0.5):
        if max_radius < 1 or not 0.0 <= explore <= 1.0:
            raise ValueError("HillClimber: max_radius >= 1 and 0 <= explore <= 1")
        self.rng = np.random.default_rng(seed)
        self.max_radius = max_radius
        self.explore = explore
        self.radius = 1
        self.best_latency = math.inf

    def setup(self, session: TuningSession) -> None:
        self.best_latency = session.best[1]  # a resumed run starts from its records

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        best, _ = session.best
        batch: list[Candidate] = []
        if layout is None:  # joint stage: a random layout takes its share of the batch
            factors = session.task.random_factors(self.rng)
            share = round(n * self.explore) if best is not None else n
            batch += self._sample(session, factors, share)
        if best is not None and (layout is None or best.factors == layout):
            space = session.task.space(best.factors)
            batch += [Candidate(best.factors, p)
                      for p in self._neighbours(space, best.point, n - len(batch))]
        fill = layout or (best.factors if best is not None else None)
        if len(batch) < n and fill is not None:
            batch += self._sample(session, fill, n - len(batch))
        return batch

    def observe(self, candidates: Sequence[Candidate], latencies: Sequence[float]) -> None:
        batch_best = min(latencies, default=math.inf)
        if batch_best < self.best_latency:
            self.best_latency, self.radius = batch_best, 1
        else:
            self.radius = min(2 * self.radius, self.max_radius)

    def _neighbours(self, space: LoopSpace, start: LoopPoint, n: int) -> list[LoopPoint]:
        """Up to ``n`` distinct points, each ``1..radius`` random moves from ``start``."""
        found: dict[LoopPoint, None] = {}
        for _ in range(4 * n):
            if len(found) == n:
                break
            point = start
            for _ in range(int(self.rng.integers(1, self.radius + 1))):
                k = int(self.rng.choice(np.flatnonzero(space.active(point))))
                directions = space.subspaces[k].num_directions
                if directions > 1:
                    point = space.move(point, k, int(self.rng.integers(1, directions)))
            if point != start:
                found[point] = None
        return list(found)

    def _sample(self, session: TuningSession, factors: Factors, n: int) -> list[Candidate]:
        points = session.task.space(factors).sample(n, self.rng) if n > 0 else []
        return [Candidate(factors, p) for p in points]
