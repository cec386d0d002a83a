"""``heron_cga``: Heron's constraint-based genetic algorithm (ASPLOS'23, §4-§5).

The joint space is a constraint satisfaction problem (``altenv.space.constraints``):
layout knobs as a first stage (:class:`LayoutConstraints`), then the loop space of the
chosen layout (:class:`LoopConstraints`, cached per layout), hardware constraints (SIMD
length, cache capacity) included. Each ``propose`` runs Heron's Algorithm 2 once:

1. the population is the better half of the last one plus random solutions of the
   constraint model (RandSAT, CP-SAT with a random search);
2. for ``generations`` rounds: roulette-wheel selection by cost-model score
   (``session.predict``); each child is a new CSP, the initial one plus crossover
   constraints ``IN(v, {parent1.v, parent2.v})`` on the key variables, minus the ones
   the mutation drops (Algorithm 3), solved at random; children are valid by
   construction and confirmed by ``LoopSpace.is_valid``;
3. the population, best predicted first, goes back to the tuning loop, whose cost model
   picks the top-k to measure.

Key variables are the loop genes with the highest gain in a small XGBoost model fitted
on the measured records (gene values -> throughput relative to the best); with fewer
than ``min_records`` records every loop gene is a key variable.

Layouts are the one departure from Heron, whose spaces have none: in the joint stage a
child takes the layout of one of its parents whole, and new layouts come only from the
random part of each population. A loop gene means something else under another layout
(its tile extent changes), and every new layout needs its own loop space and model: with
layout genes crossed like the others nearly every child was a new layout (174 layouts
for the first 8 trials of ``alt9``'s c1d_16_s2, the space cache thrashing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import xgboost as xgb

from altenv.space.constraints import (
    LAYOUT,
    Genes,
    Hardware,
    LayoutConstraints,
    LoopConstraints,
    loop_constraints,
)
from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors, OpTask, freeze

from .base import Agent, register
from .options import HeronCGAOptions


@register("heron_cga")
class HeronCGAAgent(Agent):
    """Heron's constraint-based genetic algorithm; options:
    :class:`~agents.options.HeronCGAOptions`."""

    Options = HeronCGAOptions

    def __init__(self, options: HeronCGAOptions | None = None):
        o = HeronCGAOptions() if options is None else options
        self.rng = np.random.default_rng(o.seed)
        self.population = o.population
        self.generations = o.generations
        self.key_variables = o.key_variables
        self.min_records = o.min_records
        self.mutation_prob = o.mutation_prob
        self.layouts = o.layouts
        self.hardware = o.hardware
        self._task: OpTask | None = None
        self._layout_model: LayoutConstraints | None = None
        self._pop: list[Candidate] = []
        self._records: list[tuple[Candidate, float]] = []
        self._genes: dict[Candidate, Genes] = {}

    # ------------------------------------------------------------------ protocol
    def setup(self, session: TuningSession) -> None:
        task = session.task
        self._task = task
        self._pop, self._records, self._genes = [], [], {}
        self._layout_model = LayoutConstraints(
            task.template, Hardware.of(task.target) if self.hardware else None)
        for record in session.db.records(task.key):
            factors = freeze(record.layouts["factors"])
            point = task.space(factors).from_vector(record.decisions)
            self._records.append((Candidate(factors, point), record.median))

    def observe(self, candidates: Sequence[Candidate], latencies: Sequence[float]) -> None:
        self._records += list(zip(candidates, latencies))

    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        if self._task is not session.task:
            self.setup(session)
        size = self.population or n
        keep = [c for c in self._pop if layout is None or c.factors == layout][:size // 2]
        pop = list(dict.fromkeys(keep + self._random(size - len(keep), layout)))
        fitness: dict[Candidate, float] = {}
        self._score(session, pop, fitness)
        pop = [c for c in pop if math.isfinite(fitness[c])]
        key = self.key_genes()
        for _ in range(self.generations):
            if len(pop) < 2:
                break
            parents = self._roulette(pop, fitness, size)
            children = [self._offspring(parents, key, layout) for _ in range(size)]
            new = [c for c in dict.fromkeys(children) if c is not None and c not in fitness]
            self._score(session, new, fitness)
            pop = list(dict.fromkeys(parents + [c for c in new if math.isfinite(fitness[c])]))
        ranked = sorted(pop, key=lambda c: -fitness[c])
        self._pop = ranked[:size]
        return ranked[:n]

    # ------------------------------------------------------------------ genes
    def genes(self, candidate: Candidate) -> Genes:
        """A candidate's chromosome: its layout genes and its loop genes (kept, so that
        ranking key genes over the records and pairing parents do not rebuild the loop
        models of layouts the task's space cache has dropped)."""
        assert self._task is not None and self._layout_model is not None
        if candidate not in self._genes:
            loop = self._loop_model(candidate.factors)
            self._genes[candidate] = {**self._layout_model.genes_of(dict(candidate.factors)),
                                      **loop.genes_of(candidate.point)}
        return self._genes[candidate]

    def _loop_model(self, factors: Factors) -> LoopConstraints:
        assert self._task is not None
        return loop_constraints(self._task.space(factors), self.hardware)

    def key_genes(self) -> list[str] | None:
        """The ``key_variables`` loop genes of highest XGBoost gain on the measured
        records (all genes, layout ones too, -> throughput relative to the best);
        ``None`` (every loop gene) with fewer than ``min_records`` records or no
        informative split."""
        if len(self._records) < self.min_records:
            return None
        rows = [self.genes(c) for c, _ in self._records]
        names = sorted(set().union(*rows))
        features = np.array([[_feature(name, row.get(name)) for name in names]
                             for row in rows], dtype=np.float32)
        latencies = np.array([lat for _, lat in self._records], dtype=np.float64)
        finite = latencies[np.isfinite(latencies)]
        if finite.size == 0:
            return None
        labels = np.where(np.isfinite(latencies), finite.min() / latencies, 0.0)
        booster = xgb.train({"max_depth": 3, "eta": 0.3, "nthread": 1, "verbosity": 0,
                             "seed": int(self.rng.integers(1 << 30))},
                            xgb.DMatrix(features, labels, feature_names=names),
                            num_boost_round=30)
        gain = booster.get_score(importance_type="gain")
        ranked = sorted((g for g in gain if not g.startswith(LAYOUT)),
                        key=lambda g: -gain[g])[:self.key_variables]
        return ranked or None

    # ------------------------------------------------------------------ operators
    def _random(self, m: int, layout: Factors | None) -> list[Candidate]:
        """``m`` random solutions (RandSAT): of the layout's loop model, or in the joint
        stage spread over ``layouts`` random solutions of the layout model."""
        assert self._layout_model is not None
        if m <= 0:
            return []
        if layout is not None:
            layouts = [layout]
        else:
            layouts = [freeze(self._layout_model.factors(g))
                       for g in self._layout_model.sample(self.layouts, self.rng)]
        out: list[Candidate] = []
        for i, factors in enumerate(layouts):
            share = m // len(layouts) + (i < m % len(layouts))
            points = self._loop_model(factors).sample_points(share, self.rng)
            out += [Candidate(factors, p) for p in points]
        return out

    def _score(self, session: TuningSession, candidates: Sequence[Candidate],
               fitness: dict[Candidate, float]) -> None:
        """Cost-model fitness (``-inf`` for invalid points)."""
        if candidates:
            for cand, score in zip(candidates, session.predict(candidates)):
                fitness[cand] = float(score)

    def _roulette(self, pop: Sequence[Candidate], fitness: Mapping[Candidate, float],
                  k: int) -> list[Candidate]:
        """Roulette-wheel selection: ``k`` draws with probability growing with the score
        (scores shifted to be positive); the distinct winners."""
        scores = np.array([fitness[c] for c in pop])
        weights = scores - scores.min() + 1e-3 * (np.ptp(scores) + 1e-9)
        picks = self.rng.choice(len(pop), size=k, p=weights / weights.sum())
        return list(dict.fromkeys(pop[int(i)] for i in picks))

    def _offspring(self, parents: Sequence[Candidate], key: Sequence[str] | None,
                   layout: Factors | None) -> Candidate | None:
        """Heron's Algorithm 3 for one child: crossover constraints on the key loop
        genes of two random parents, mutation drops some, the new CSP is solved at
        random; in the joint stage the child takes one parent's layout. ``None`` when the
        CSP leaves no child other than the parents."""
        assert self._task is not None
        i, j = self.rng.choice(len(parents), size=2, replace=len(parents) < 2)
        p1, p2 = parents[int(i)], parents[int(j)]
        if layout is None:
            layout = (p1, p2)[int(self.rng.integers(2))].factors
        model = self._loop_model(layout)
        g1, g2 = self.genes(p1), self.genes(p2)
        names = set(model.values) if key is None else set(key) & set(model.values)
        allowed = {v: {g[v] for g in (g1, g2) if v in g} for v in sorted(names)}
        allowed = {v: s for v, s in allowed.items() if s}
        if allowed:
            drops = 1 + self.rng.binomial(len(allowed) - 1, self.mutation_prob)
            for v in self.rng.choice(sorted(allowed), size=drops, replace=False):
                del allowed[str(v)]
        forbidden = [model.genes_of(p.point) for p in (p1, p2) if p.factors == layout]
        genes = model.solve(self.rng, allowed, forbidden)
        if genes is None:  # no child of these parents: the random part renews the population
            return None
        point = model.point(genes)
        return Candidate(layout, point) if model.space.is_valid(point) else None


def _feature(name: str, value: int | None) -> float:
    """A gene as an XGBoost feature: log2 of tile sizes and layout factors, indices as
    they are, NaN (missing) for a gene the chromosome lacks."""
    if value is None:
        return math.nan
    if name.startswith(("t", LAYOUT)):
        return math.log2(value)
    return float(value)
