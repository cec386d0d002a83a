"""Mind Mappings' differentiable surrogate (ASPLOS'21 §4.1) over altenv's joint space.

A candidate (template factors + loop point) becomes one fixed-size float vector, the
surrogate's input (§4.1.2)::

    [ kind one-hot | workload dims | layout knobs | loop point ]
      len(KINDS)     WORKLOAD_KEYS   MAX_KNOBS      LOOP_SIZE

Workload dims are ``log2(1 + value) / 10`` (the problem id ``p`` of the paper, so one
surrogate serves many workloads); a knob is ``log(factor) / log(extent)``; the loop point
is :meth:`LoopSpace.encode` (tile factors as log ratios, indices scaled), zero-padded.
Every entry lies in [0, 1] by construction, which stands in for the paper's input
whitening and keeps a checkpoint meaningful on unseen workloads.

The output is a normalized cost (§4.1.3): a candidate's log latency minus the best log
latency measured on its workload (failures excluded). :class:`CandidateCodec` also
projects a continuous vector back onto the nearest valid candidate (§4.2): knobs to the
nearest divisor, each loop subspace to its nearest legal value, and, when the rounded
point fails MetaSchedule's checks, the nearest of a pool of sampled valid points.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from torch import nn

from altenv.ops import KINDS, divisors, nearest_divisor
from altenv.ops.workload import KEYS, Workload
from altenv.records import RecordDB
from altenv.space import (
    CategoricalSubspace,
    ComputeLocationSubspace,
    DesignSubspace,
    LoopPoint,
    Subspace,
    TileSubspace,
)
from altenv.tuning.task import Candidate, Factors, OpTask, freeze
from envs.wrappers import MAX_VECTOR

WORKLOAD_KEYS = tuple(sorted({k for req, opt in KEYS.values() for k in (*req, *opt)} | {"N"}))
"""Every operator parameter name; absent ones encode as 0."""
MAX_KNOBS = 16
"""Layout knobs of the largest template (C3D with two levels has 13)."""
LOOP_SIZE = MAX_VECTOR
"""Loop-point entries, as in the padded loop environment."""
INPUT_SIZE = len(KINDS) + len(WORKLOAD_KEYS) + MAX_KNOBS + LOOP_SIZE
FORMAT = f"mind-mappings/v1/{len(KINDS)}-{len(WORKLOAD_KEYS)}-{MAX_KNOBS}-{LOOP_SIZE}"
"""Checkpoints of another encoding are refused."""
LAYOUT_SLICE = slice(len(KINDS) + len(WORKLOAD_KEYS), len(KINDS) + len(WORKLOAD_KEYS) + MAX_KNOBS)
LOOP_SLICE = slice(LAYOUT_SLICE.stop, INPUT_SIZE)


def workload_features(workload: Workload) -> np.ndarray:
    """The problem id: the kind one-hot, then each parameter as ``log2(1 + v) / 10``
    (per-dimension tuples averaged)."""
    out = np.zeros(len(KINDS) + len(WORKLOAD_KEYS), dtype=np.float32)
    out[KINDS.index(workload.kind)] = 1.0
    for i, key in enumerate(WORKLOAD_KEYS):
        value = workload.get(key)
        if value is not None:
            out[len(KINDS) + i] = math.log2(1 + float(np.mean(value))) / 10
    return out


def normalized_costs(latencies: Sequence[float]) -> np.ndarray:
    """Log latency minus the workload's best log latency (all latencies finite)."""
    logs = np.log(np.asarray(latencies, dtype=np.float64))
    return (logs - logs.min()).astype(np.float32)


# ----------------------------------------------------------------- projection
def _perfect_tiles(extent: int, levels: int) -> list[tuple[int, ...]]:
    """Every ordered ``levels``-tuple of positive ints whose product is ``extent``."""
    if levels == 1:
        return [(extent,)]
    return [(d, *rest) for d in divisors(extent)
            for rest in _perfect_tiles(extent // d, levels - 1)]


@lru_cache(maxsize=4096)
def _domain(sub: Subspace) -> tuple[tuple[tuple[int, ...], ...], np.ndarray]:
    """The legal values of a subspace and their encodings (one row each)."""
    if isinstance(sub, TileSubspace):
        values = [v for v in _perfect_tiles(sub.extent, sub.levels) if sub.is_valid(v)]
    elif isinstance(sub, DesignSubspace):
        values = [(i,) for i in range(sub.count)]
    elif isinstance(sub, CategoricalSubspace):
        values = [(i,) for i in range(len(sub.candidates))]
    elif isinstance(sub, ComputeLocationSubspace):
        values = [(i,) for i in range(-2, sub.num_loops)]
    else:
        raise TypeError(f"no projection for subspace {type(sub).__name__}")
    return tuple(values), np.array([sub.encode(v) for v in values], dtype=np.float32)


def nearest_value(sub: Subspace, x: np.ndarray) -> tuple[int, ...]:
    """The legal value of ``sub`` whose encoding is nearest to ``x`` (Euclidean)."""
    values, encoded = _domain(sub)
    return values[int(np.argmin(((encoded - x) ** 2).sum(axis=1)))]


class CandidateCodec:
    """Encodes candidates of one task as surrogate inputs and projects vectors back.

    Parameters
    ----------
    task:
        The operator task.
    rng:
        Draws of random layouts and of the sampled valid points.
    pool_size:
        MetaSchedule-sampled valid points drawn per layout for the fallback projection
        (the draws of :meth:`random` join them, up to eight times as many).
    """

    def __init__(self, task: OpTask, rng: np.random.Generator, pool_size: int = 4):
        knobs = task.template.knobs
        if len(knobs) > MAX_KNOBS:
            raise ValueError(f"{task.key}: {len(knobs)} layout knobs exceed {MAX_KNOBS}")
        self.task, self.rng, self.pool_size = task, rng, pool_size
        self.prefix = workload_features(task.workload)
        self._pools: dict[Factors, list[LoopPoint]] = {}
        self._sampled: set[Factors] = set()
        self.stats = {"projections": 0, "fallbacks": 0}
        """Projections made, and how many needed the sampled-point fallback."""

    # ------------------------------------------------------------ encoding
    def encode(self, candidate: Candidate) -> np.ndarray:
        """The surrogate input of a candidate (length :data:`INPUT_SIZE`)."""
        out = np.zeros(INPUT_SIZE, dtype=np.float32)
        out[:LAYOUT_SLICE.start] = self.prefix
        factors = dict(candidate.factors)
        for i, knob in enumerate(self.task.template.knobs):
            if knob.extent > 1:
                out[LAYOUT_SLICE.start + i] = math.log(factors[knob.name]) / math.log(knob.extent)
        space = self.task.space(candidate.factors)
        if space.vector_size > LOOP_SIZE:
            raise ValueError(f"{self.task.key}: loop space of {space.vector_size} entries "
                             f"exceeds {LOOP_SIZE}")
        out[LOOP_SLICE.start:LOOP_SLICE.start + space.vector_size] = space.encode(candidate.point)
        return out

    def encode_many(self, candidates: Iterable[Candidate]) -> np.ndarray:
        rows = [self.encode(c) for c in candidates]
        return np.stack(rows) if rows else np.zeros((0, INPUT_SIZE), dtype=np.float32)

    def movable(self, factors: Factors, fixed_layout: bool) -> np.ndarray:
        """Mask of the entries a search may change at a candidate of layout ``factors``:
        the knobs (unless the layout is fixed) and the loop entries of its space."""
        mask = np.zeros(INPUT_SIZE, dtype=bool)
        if not fixed_layout:
            mask[LAYOUT_SLICE.start:LAYOUT_SLICE.start + len(self.task.template.knobs)] = True
        size = self.task.space(factors).vector_size
        mask[LOOP_SLICE.start:LOOP_SLICE.start + size] = True
        return mask

    # ---------------------------------------------------------- projection
    def factors_of(self, x: np.ndarray) -> Factors:
        """Knob entries rounded to divisors: ``R(extent ** x)``; a multi-level dim's
        later levels divide what the earlier ones left."""
        out: dict[str, int] = {}
        left: dict[str, int] = {}
        for i, knob in enumerate(self.task.template.knobs):
            key = knob.name.rstrip("0123456789")
            rest = left.get(key, knob.extent)
            value = min(max(float(x[LAYOUT_SLICE.start + i]), 0.0), 1.0)
            out[knob.name] = nearest_divisor(rest, knob.extent ** value)
            left[key] = rest // out[knob.name]
        return freeze(out)

    def project(self, x: np.ndarray, layout: Factors | None = None
                ) -> tuple[Candidate | None, bool]:
        """The valid candidate nearest to ``x`` and whether rounding alone gave it
        (``False``: the nearest sampled valid point of its layout replaced an invalid
        rounding). ``layout`` fixes the factors. ``(None, False)`` if the layout has no
        valid point at all."""
        factors = layout if layout is not None else self.factors_of(x)
        space = self.task.space(factors)
        loop = x[LOOP_SLICE]
        values, at = [], 0
        for sub in space.subspaces:
            values.append(nearest_value(sub, loop[at:at + sub.size]))
            at += sub.size
        point = LoopPoint(tuple(values))
        self.stats["projections"] += 1
        if space.is_valid(point):
            return Candidate(factors, point), True
        self.stats["fallbacks"] += 1
        pool = self.pool(factors)
        if not pool:
            return None, False
        encoded = np.stack([space.encode(p) for p in pool])
        target = loop[:space.vector_size]
        best = pool[int(np.argmin(((encoded - target) ** 2).sum(axis=1)))]
        return Candidate(factors, best), False

    def pool(self, factors: Factors) -> list[LoopPoint]:
        """Sampled valid points of a layout: the draws of :meth:`random`, topped up to
        ``pool_size`` on first use."""
        pool = self._pools.setdefault(factors, [])
        if factors not in self._sampled:
            self._sampled.add(factors)
            pool += self.task.space(factors).sample(max(self.pool_size - len(pool), 0),
                                                    self.rng)
        return pool

    def random(self, layout: Factors | None = None) -> Candidate | None:
        """A random valid candidate: a random layout (unless fixed) and a point drawn by
        MetaSchedule's sampling; ``None`` if that layout gave no valid point."""
        factors = layout if layout is not None else self.task.random_factors(self.rng)
        points = self.task.space(factors).sample(1, self.rng)
        if not points:
            return None
        pool = self._pools.setdefault(factors, [])
        pool.append(points[0])
        del pool[:-8 * self.pool_size]
        return Candidate(factors, points[0])


# ------------------------------------------------------------------- surrogate
@contextmanager
def _one_thread() -> Iterator[None]:
    """Run torch on one thread: a small MLP only loses to thread synchronization (many
    times slower on a loaded two-core machine); the caller's setting is restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Surrogate(nn.Module):
    """The MLP ``f*(m, p)``: encoded candidate -> normalized cost (lower is faster).

    Parameters
    ----------
    hidden_sizes:
        Widths of the hidden layers (SiLU activations, so input gradients are smooth).
    seed:
        Seed of the initial weights and of the minibatch order.
    """

    def __init__(self, hidden_sizes: Sequence[int] = (256, 128), seed: int = 0):
        super().__init__()
        self.hidden_sizes = tuple(int(h) for h in hidden_sizes)
        self.generator = torch.Generator().manual_seed(seed)
        layers: list[nn.Module] = []
        width = INPUT_SIZE
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for h in self.hidden_sizes:
                layers += [nn.Linear(width, h), nn.SiLU()]
                width = h
            layers.append(nn.Linear(width, 1))
            self.net = nn.Sequential(*layers)
        self.samples_seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(-1)

    def fit(self, x: np.ndarray, y: np.ndarray, epochs: int = 50, lr: float = 1e-3,
            batch_size: int = 128) -> list[float]:
        """Train with Adam on the Huber loss (§5.5) for ``epochs`` passes; returns the
        mean training loss of each pass. Training continues from the current weights."""
        xs = torch.as_tensor(x, dtype=torch.float32)
        ys = torch.as_tensor(y, dtype=torch.float32)
        optim = torch.optim.Adam(self.parameters(), lr=lr, weight_decay=1e-5)
        loss_fn = nn.HuberLoss(delta=1.0)
        history = []
        self.train()
        with _one_thread():
            for _ in range(epochs):
                order = torch.randperm(len(xs), generator=self.generator)
                total = 0.0
                for start in range(0, len(xs), batch_size):
                    idx = order[start:start + batch_size]
                    optim.zero_grad()
                    loss = loss_fn(self(xs[idx]), ys[idx])
                    loss.backward()
                    optim.step()
                    total += loss.item() * len(idx)
                history.append(total / max(len(xs), 1))
        self.samples_seen += len(xs) * epochs
        self.eval()
        return history

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted normalized costs of encoded candidates."""
        with torch.no_grad(), _one_thread():
            return self(torch.as_tensor(x, dtype=torch.float32)).numpy()

    def gradient(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Predicted costs and their gradients w.r.t. the inputs (one row each)."""
        xs = torch.as_tensor(x, dtype=torch.float32).clone().requires_grad_(True)
        with _one_thread():
            cost = self(xs)
            (grad,) = torch.autograd.grad(cost.sum(), xs)
        return cost.detach().numpy(), grad.numpy()

    # ----------------------------------------------------------- checkpoints
    def save(self, path: str | Path) -> None:
        """Write weights and shape to one file."""
        torch.save({"format": FORMAT, "hidden_sizes": list(self.hidden_sizes),
                    "samples_seen": self.samples_seen, "state_dict": self.state_dict()},
                   Path(path))

    @classmethod
    def load(cls, path: str | Path, seed: int = 0) -> Surrogate:
        """A surrogate written by :meth:`save`."""
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        if state.get("format") != FORMAT:
            raise ValueError(f"{path}: surrogate encoding {state.get('format')!r}, this "
                             f"version reads {FORMAT!r}")
        model = cls(state["hidden_sizes"], seed=seed)
        model.load_state_dict(state["state_dict"])
        model.samples_seen = int(state["samples_seen"])
        model.eval()
        return model


# ------------------------------------------------------------------ datasets
def task_of_key(key: str, target: object = None) -> OpTask:
    """The :class:`OpTask` of a records workload key (``spec`` or ``spec|bias+relu``)."""
    spec, _, epilogue = key.partition("|")
    return OpTask(spec, target, tuple(epilogue.split("+")) if epilogue else ())


def records_dataset(db: RecordDB, target: object = None, seed: int = 0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Encoded successful records of every workload in ``db`` and their normalized
    costs (each workload against its own best)."""
    xs, ys = [], []
    for key in db.workloads():
        ok = [r for r in db.records(key) if r.ok]
        if not ok:
            continue
        task = task_of_key(key, target)
        codec = CandidateCodec(task, np.random.default_rng(seed))
        cands = []
        for record in ok:
            factors = freeze(record.layouts["factors"])
            cands.append(Candidate(factors, task.space(factors).from_vector(record.decisions)))
        xs.append(codec.encode_many(cands))
        ys.append(normalized_costs([r.median for r in ok]))
    if not xs:
        return np.zeros((0, INPUT_SIZE), dtype=np.float32), np.zeros(0, dtype=np.float32)
    return np.concatenate(xs), np.concatenate(ys)


def pretrain(record_files: Sequence[str | Path], hidden_sizes: Sequence[int] = (256, 128),
             epochs: int = 200, lr: float = 1e-3, seed: int = 0,
             target: object = None) -> Surrogate:
    """Phase 1 offline: one surrogate trained on the records of several workloads (e.g.
    the ``records.jsonl`` of earlier runs); save it and pass it as ``checkpoint``."""
    xs, ys = [], []
    for path in record_files:
        with RecordDB(path) as db:
            x, y = records_dataset(db, target, seed)
        xs.append(x)
        ys.append(y)
    x, y = np.concatenate(xs), np.concatenate(ys)
    if not len(x):
        raise ValueError(f"pretrain: no successful records in {list(map(str, record_files))}")
    model = Surrogate(hidden_sizes, seed=seed)
    model.fit(x, y, epochs=epochs, lr=lr)
    return model
