"""``mind_mappings``: projected gradient descent on a differentiable surrogate
(Mind Mappings, ASPLOS'21 §4).

Phase 1 (§4.1): an MLP surrogate (:mod:`agents.mm_surrogate`) predicts a candidate's
normalized cost from its encoding — workload dims, layout knobs and loop point — so one
surrogate is trained across workloads (a checkpoint from ``altenv train`` or
:func:`agents.mm_surrogate.pretrain`) and keeps learning from each measured batch.

Phase 2 (§4.2): chains start at random valid candidates (and the best measured ones) and
follow the surrogate's input gradient; every step is projected onto the nearest valid
candidate (knobs to divisors, loop subspaces to legal values, else the nearest sampled
valid point); every ``injection_period`` steps each chain may jump to a random valid
candidate, accepted by simulated annealing on the predicted cost. The distinct
candidates the chains visit form the proposed batch; the session's cost model picks
which of them are measured. In the joint stage (``layout=None``) chains move layouts and
loops together; in the loop-only stage the layout is fixed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from altenv.tuning.session import TuningSession
from altenv.tuning.task import Candidate, Factors, freeze

from .base import Agent, register
from .mm_surrogate import CandidateCodec, Surrogate, normalized_costs
from .options import MindMappingsOptions, RandomOptions
from .random import RandomAgent

CHECKPOINT_FILE = "surrogate.pt"


def gradient_search(codec: CandidateCodec, surrogate: Surrogate, starts: Sequence[Candidate],
                    layout: Factors | None, steps: int, step_size: float,
                    injection_period: int, temperature: float,
                    rng: np.random.Generator) -> dict[Candidate, float]:
    """Projected gradient descent from ``starts`` (one chain each) with random
    injections; returns every distinct candidate the chains visited with its predicted
    cost.

    The iterate stays continuous (clipped to [0, 1]) so that steps smaller than the
    rounding grid accumulate; each step's projection is the chain's candidate, and when
    rounding is invalid the iterate moves to the valid point that replaced it. A step
    moves the entry of largest gradient by ``step_size`` (gradients normalized per chain).
    """
    fixed = layout is not None
    current = list(starts)
    x = codec.encode_many(current)
    mask = np.stack([codec.movable(c.factors, fixed) for c in current])
    visited = dict.fromkeys(current)

    def move_to(i: int, cand: Candidate, snap: bool) -> None:
        if cand.factors != current[i].factors:
            mask[i] = codec.movable(cand.factors, fixed)
        encoded = codec.encode(cand)
        x[i] = encoded if snap else np.where(mask[i], x[i], encoded)
        current[i] = cand
        visited[cand] = None

    for t in range(1, steps + 1):
        _, grad = surrogate.gradient(x)
        grad = np.where(mask, grad, 0.0)
        scale = np.maximum(np.abs(grad).max(axis=1, keepdims=True), 1e-12)
        x = np.where(mask, np.clip(x - step_size * grad / scale, 0.0, 1.0), x)
        for i in range(len(current)):
            cand, rounded = codec.project(x[i], layout)
            if cand is None:  # a layout without valid points: restart the chain
                cand, rounded = codec.random(layout), False
            if cand is not None:
                move_to(i, cand, snap=not rounded)
        if injection_period and t % injection_period == 0:
            randoms = [codec.random(layout) for _ in current]
            live = [i for i, r in enumerate(randoms) if r is not None]
            if live:
                now = surrogate.predict(codec.encode_many(current[i] for i in live))
                new = surrogate.predict(codec.encode_many(randoms[i] for i in live))
                for i, f_now, f_new in zip(live, now, new):
                    worse = float(f_new - f_now)
                    if worse <= 0 or (temperature > 0 and
                                      rng.random() < math.exp(-worse / temperature)):
                        move_to(i, randoms[i], snap=True)
    cands = list(visited)
    return dict(zip(cands, surrogate.predict(codec.encode_many(cands)).tolist()))


@register("mind_mappings")
class MindMappingsAgent(Agent):
    """Mind Mappings search: an MLP surrogate and projected gradient descent; options:
    :class:`~agents.options.MindMappingsOptions`."""

    Options = MindMappingsOptions

    def __init__(self, options: MindMappingsOptions | None = None):
        o = MindMappingsOptions() if options is None else options
        seed = o.seed
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.chains, self.steps, self.step_size = o.chains, o.steps, o.step_size
        self.injection_period, self.temperature, self.anneal = (
            o.injection_period, o.temperature, o.anneal)
        self.learning_rate, self.epochs = o.learning_rate, o.epochs
        self.min_records, self.best_starts = o.min_records, o.best_starts
        self.pretrained = o.checkpoint is not None
        if o.checkpoint is not None:
            path = Path(o.checkpoint)
            self.surrogate = Surrogate.load(path / CHECKPOINT_FILE if path.is_dir() else path,
                                            seed=seed)
        else:
            self.surrogate = Surrogate(o.hidden_sizes, seed=seed)
        self.data: dict[str, dict[Candidate, tuple[np.ndarray, float]]] = {}
        """Per workload key: successful candidates, their encodings and latencies."""
        self._random = RandomAgent(RandomOptions(seed=seed))
        self._session: TuningSession | None = None
        self._codec: CandidateCodec | None = None
        self._temperature = o.temperature

    # ----------------------------------------------------------------- data
    def setup(self, session: TuningSession) -> None:
        """Bind to a session: its recorded measurements join the training data."""
        self._session = session
        self._codec = CandidateCodec(session.task, self.rng)
        self._temperature = self.temperature
        task = session.task
        ok = [r for r in session.db.records(task.key) if r.ok]
        cands = []
        for record in ok:
            factors = freeze(record.layouts["factors"])
            cands.append(Candidate(factors, task.space(factors).from_vector(record.decisions)))
        if self._add(cands, [r.median for r in ok]):
            self.fit()

    def observe(self, candidates: Sequence[Candidate], latencies: Sequence[float]) -> None:
        """Measured candidates join the data; the surrogate trains on it."""
        if self._add(candidates, latencies):
            self.fit()

    def _add(self, candidates: Sequence[Candidate], latencies: Sequence[float]) -> int:
        """Record successful measurements of the bound task; returns how many were new."""
        own = self.data.setdefault(self._session.task.key, {})
        new = 0
        for cand, lat in zip(candidates, latencies):
            if math.isfinite(lat) and cand not in own:
                own[cand] = (self._codec.encode(cand), float(lat))
                new += 1
        return new

    def dataset(self) -> tuple[np.ndarray, np.ndarray]:
        """Encodings and normalized costs of every workload's measurements."""
        xs, ys = [], []
        for rows in self.data.values():
            if rows:
                xs.append(np.stack([enc for enc, _ in rows.values()]))
                ys.append(normalized_costs([lat for _, lat in rows.values()]))
        if not xs:
            return np.zeros((0, 0), dtype=np.float32), np.zeros(0, dtype=np.float32)
        return np.concatenate(xs), np.concatenate(ys)

    def fit(self) -> list[float]:
        """Train the surrogate on :meth:`dataset` for ``epochs`` passes."""
        x, y = self.dataset()
        return self.surrogate.fit(x, y, epochs=self.epochs, lr=self.learning_rate)

    @property
    def ready(self) -> bool:
        """Whether the surrogate may guide the search: pretrained, or trained on at least
        ``min_records`` measurements (of any workload: it generalizes across them)."""
        return self.pretrained or sum(map(len, self.data.values())) >= self.min_records

    # --------------------------------------------------------------- search
    def propose(self, session: TuningSession, n: int, layout: Factors | None
                ) -> list[Candidate]:
        """Up to ``n`` distinct unmeasured valid candidates visited by the descent, best
        predicted first (random ones until the surrogate is ready; topped up with random
        ones when the descent finds fewer than ``n // 4``)."""
        if session is not self._session:
            self.setup(session)
        if not self.ready:
            return self._random.propose(session, n, layout)
        codec = self._codec
        chains = max(1, min(self.chains, n))
        own = self.data.get(session.task.key, {})
        best = sorted((lat, i, c) for i, (c, (_, lat)) in enumerate(own.items())
                      if layout is None or c.factors == layout)
        starts = [c for _, _, c in best[:int(chains * self.best_starts)]]
        while len(starts) < chains:
            cand = codec.random(layout)
            if cand is None:
                break
            starts.append(cand)
        if not starts:
            return self._random.propose(session, n, layout)
        visited = gradient_search(codec, self.surrogate, starts, layout, self.steps,
                                  self.step_size, self.injection_period, self._temperature,
                                  self.rng)
        self._temperature *= self.anneal
        fresh = sorted((c for c in visited if session.measured(c) is None), key=visited.get)
        for _ in range(max(n // 4 - len(fresh), 0)):
            cand = codec.random(layout)
            if cand is not None and session.measured(cand) is None and cand not in fresh:
                fresh.append(cand)
        return fresh[:n]

    # ---------------------------------------------------------- checkpoints
    def save(self, path: str | Path) -> None:
        """Write the surrogate to ``path/surrogate.pt`` (``checkpoint=path`` loads it)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.surrogate.save(path / CHECKPOINT_FILE)
