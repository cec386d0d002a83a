"""``evolution``: layout exploration plus a cost-model-guided evolutionary loop search.

ALT's two stages (§5.2) with the loop search of Ansor / MetaSchedule's evolutionary
strategy in place of random batches:

- Each batch evolves a population of loop points for a few generations: parents are
  the best measured points of the layout, the best predicted points kept from earlier
  batches and fresh MetaSchedule samples; children are one or two ``LoopSpace.move``
  mutations of parents drawn in proportion to their predicted throughput. The cost
  model scores every point (features cached by the session).
- The batch measures the ``top_k`` best-predicted new points, except that a share
  ``epsilon`` of them is drawn at random from the fresh samples (exploration, as
  MetaSchedule's epsilon-greedy).
- In the joint stage each batch spreads its population over a few layouts: the best
  measured layout, a neighbour of it (one template knob moved to an adjacent divisor)
  and a random layout, so the cost model (normalized per workload, comparable across
  layouts) ranks layouts and loops together. The loop-only stage keeps the best layout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from altenv.tuning.loop import Budget
from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors, freeze

from .base import Agent, register


@register("evolution")
class EvolutionAgent(Agent):
    """Evolutionary search over the joint space, ranked by the session's cost model.

    Parameters
    ----------
    seed:
        Seed of sampling, mutation and exploration.
    population:
        Points kept per layout between generations.
    generations:
        Mutation rounds per batch.
    children:
        Children made per generation (split over the batch's layouts).
    samples:
        Fresh MetaSchedule samples per layout and batch.
    elites:
        Best measured points of a layout that join each batch's parents.
    epsilon:
        Share of each measured batch drawn at random from the fresh samples.
    layouts_per_batch:
        Layouts explored together in a joint-stage batch.
    """

    def __init__(self, seed: int = 0, population: int = 64, generations: int = 3,
                 children: int = 96, samples: int = 48, elites: int = 16,
                 epsilon: float = 0.125, layouts_per_batch: int = 3):
        if not 0 <= epsilon <= 1:
            raise ValueError(f"evolution: epsilon must be in [0, 1], got {epsilon}")
        self.rng = np.random.default_rng(seed)
        self.population, self.generations, self.children = population, generations, children
        self.samples, self.elites, self.epsilon = samples, elites, epsilon
        self.layouts_per_batch = layouts_per_batch
        self._pool: dict[Factors, list[Candidate]] = {}

    # ----------------------------------------------------------------- layouts
    def _neighbour(self, session: TuningSession, factors: Factors) -> Factors:
        """``factors`` with one knob moved to an adjacent divisor of its extent."""
        choices = session.task.factor_choices()
        values = dict(factors)
        movable = [k for k in values if len(choices.get(k, [])) > 1]
        if not movable:
            return factors
        knob = movable[int(self.rng.integers(len(movable)))]
        options = choices[knob]
        i = options.index(values[knob]) if values[knob] in options else 0
        values[knob] = options[int(np.clip(i + self.rng.choice([-1, 1]), 0, len(options) - 1))]
        return freeze(values)

    def _layouts(self, session: TuningSession, joint: bool) -> list[Factors]:
        best, _ = session.best
        if not joint:
            return [best.factors]
        if best is None:
            first = [session.task.default_factors()]
        else:
            first = [best.factors, self._neighbour(session, best.factors)]
        while len(first) < self.layouts_per_batch:
            first.append(session.task.random_factors(self.rng))
        return list(dict.fromkeys(first))

    # ----------------------------------------------------------------- loops
    def _elites(self, session: TuningSession, factors: Factors) -> list[Candidate]:
        measured = [(lat, c) for c, lat in session.measured_items() if c.factors == factors
                    and math.isfinite(lat)]
        measured.sort(key=lambda pair: pair[0])
        return [c for _, c in measured[:self.elites]]

    def _mutate(self, session: TuningSession, parent: Candidate) -> Candidate:
        space = session.task.space(parent.factors)
        point = parent.point
        active = [k for k in np.flatnonzero(space.active(point))
                  if space.subspaces[k].num_directions > 1]
        for _ in range(1 + int(self.rng.random() < 0.3)):
            if not active:
                break
            k = int(self.rng.choice(active))
            direction = int(self.rng.integers(1, space.subspaces[k].num_directions))
            point = space.move(point, k, direction)
        return Candidate(parent.factors, point)

    def _evolve(self, session: TuningSession, layouts: list[Factors]
                ) -> tuple[list[Candidate], np.ndarray, list[Candidate]]:
        """The final population of every layout with its predicted scores, and the fresh
        samples (for exploration)."""
        fresh: list[Candidate] = []
        parents: list[Candidate] = []
        for factors in layouts:
            points = session.task.space(factors).sample(self.samples, self.rng)
            fresh += [Candidate(factors, p) for p in points]
            parents += self._elites(session, factors) + self._pool.get(factors, [])
        population = list(dict.fromkeys(parents + fresh))
        scores = session.predict(population)
        for _ in range(self.generations):
            finite = np.isfinite(scores)
            if not finite.any():
                break
            ranks = np.argsort(np.argsort(-np.where(finite, scores, -np.inf)))
            weights = np.where(finite, 1.0 / (1.0 + ranks), 0.0)
            picks = self.rng.choice(len(population), size=self.children, p=weights / weights.sum())
            kids = [self._mutate(session, population[int(i)]) for i in picks]
            kids = [k for k in dict.fromkeys(kids) if k not in set(population)]
            if kids:
                population += kids
                scores = np.concatenate([scores, session.predict(kids)])
            keep = np.argsort(-scores, kind="stable")[:self.population * len(layouts)]
            population = [population[int(i)] for i in keep]
            scores = scores[keep]
        for factors in layouts:
            self._pool[factors] = [c for c in population if c.factors == factors
                                   ][:self.population]
        return population, scores, fresh

    def _choose(self, session: TuningSession, population: list[Candidate], scores: np.ndarray,
                fresh: list[Candidate], k: int) -> list[Candidate]:
        """Top-``k`` unmeasured by prediction, ``epsilon`` of them random fresh samples."""
        explore = min(int(round(self.epsilon * k)), k - 1) if k > 1 else 0
        chosen: list[Candidate] = []
        for i in np.argsort(-scores, kind="stable"):
            cand = population[int(i)]
            if len(chosen) == k - explore or not np.isfinite(scores[i]):
                break
            if session.measured(cand) is None and cand not in chosen:
                chosen.append(cand)
        unmeasured = [c for c in fresh if session.measured(c) is None and c not in chosen]
        for i in self.rng.permutation(len(unmeasured))[:k - len(chosen)]:
            chosen.append(unmeasured[int(i)])
        return chosen

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """The evolved population of a batch, best predicted first (for callers that rank
        it themselves; :meth:`run` measures it with exploration)."""
        layouts = [layout] if layout is not None else self._layouts(session, True)
        population, scores, _ = self._evolve(session, layouts)
        return [population[int(i)] for i in np.argsort(-scores, kind="stable")[:n]]

    def run(self, session: TuningSession, budget: Budget, batch: int, top_k: int,
            report: Callable[[TuningSession], None], max_stalls: int = 5) -> None:
        """Evolve and measure ``top_k`` per batch until the budget is spent (``batch`` is
        not used: the population sizes set the search effort)."""
        stalls = 0
        while session.trials < budget.total and stalls < max_stalls:
            joint = session.trials < budget.joint or session.best[0] is None
            start, model = time.perf_counter(), session.seconds["cost_model"]
            population, scores, fresh = self._evolve(session, self._layouts(session, joint))
            k = min(top_k, budget.total - session.trials)
            chosen = self._choose(session, population, scores, fresh, k)
            session.seconds["search"] += (time.perf_counter() - start
                                          - (session.seconds["cost_model"] - model))
            if not chosen:
                stalls += 1
                continue
            stalls = 0
            latencies = session.measure(chosen)
            self.observe(chosen, latencies)
            report(session)
