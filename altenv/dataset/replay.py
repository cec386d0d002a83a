"""Replaying a dataset: a program's latency, features and neighbours without TVM.

:class:`WorkloadReplay` holds one workload of a dataset as a search sees it: its layouts,
each layout's loop space rebuilt from the dataset's description of its subspaces (the
same :mod:`altenv.space.subspace` classes, so a direction moves a point exactly as
``LoopSpace.step`` would, less the validity check that needs the program), and the
measured programs indexed by their decisions. :meth:`WorkloadReplay.latency` answers a
measured program with one of its own timings drawn at random (so the noise is the
measured one) and any other point with the :class:`~altenv.dataset.surrogate.Surrogate`;
it says which it did.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..space import subspace as subspaces
from .store import WorkloadData
from .surrogate import Surrogate, layout_vector, point_features, program_input

Point = tuple[int, ...]


def rebuild_subspace(entry: dict[str, Any]) -> subspaces.Subspace:
    """A subspace from its JSON description (``LoopSpace.describe``)."""
    cls = getattr(subspaces, entry["type"])
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in entry.items()
              if k in names}
    return cls(**values)


def program_key(factors: dict[str, int], decisions: Sequence[int]) -> tuple[Any, ...]:
    """A program's identity as plain ints (what seeds its calibration noise)."""
    return (tuple(sorted((k, int(v)) for k, v in factors.items())),
            tuple(int(d) for d in decisions))


class LayoutReplay:
    """One layout of a workload: its loop space's subspaces and its measured programs."""

    def __init__(self, index: int, entry: dict[str, Any], rows: np.ndarray,
                 data: WorkloadData):
        self.index = index
        self.description: list[dict[str, Any]] = list(entry["subspaces"])
        self.factors: dict[str, int] = {k: int(v) for k, v in entry["factors"].items()}
        self.framework = bool(entry.get("framework"))
        self.subspaces = [rebuild_subspace(s) for s in entry["subspaces"]]
        self.sizes = [s.size for s in self.subspaces]
        self.designs = [set(slots) for slots in entry.get("designs", [])]
        self.rows = rows
        self.points: dict[Point, int] = {data.decisions[i]: int(i) for i in rows}
        self.sampled = [int(i) for i in rows]
        self.encodings = (np.stack([data.encoding[i] for i in rows]) if len(rows)
                          else np.zeros((0, 0), dtype=np.float32))
        self._encoded: dict[Point, np.ndarray] = {}

    @property
    def nvec(self) -> np.ndarray:
        return np.array([s.num_directions for s in self.subspaces], dtype=np.int64)

    def split(self, point: Point) -> list[tuple[int, ...]]:
        out, at = [], 0
        for size in self.sizes:
            out.append(point[at:at + size])
            at += size
        return out

    def step(self, point: Point, directions: Sequence[int]) -> Point:
        """Every subspace moved one step in its direction (its nearest arithmetically
        valid neighbour; staying put where there is none). A direction past a subspace's
        count wraps around, as the live env's (``envs.wrappers.fit_directions``)."""
        values = self.split(point)
        for k, d in enumerate(directions[:len(values)]):
            d = int(d) % self.subspaces[k].num_directions
            if d:
                nxt = next(self.subspaces[k].neighbours(values[k], int(d)), None)
                if nxt is not None:
                    values[k] = tuple(nxt)
        return self.canonical(values)

    def canonical(self, values: list[tuple[int, ...]]) -> Point:
        """The point of per-subspace ``values`` with the subspaces its design does not read
        at their canonical values (``LoopSpace.canonical``), as the dataset stores them."""
        design = values[0][0]
        if 0 <= design < len(self.designs):
            read = self.designs[design] | {0}
            values = [v if k in read else sub.canonical
                      for k, (v, sub) in enumerate(zip(values, self.subspaces))]
        return tuple(v for value in values for v in value)

    def encode(self, point: Point) -> np.ndarray:
        """``LoopSpace.encode`` of ``point`` (cached: a walk revisits its points)."""
        enc = self._encoded.get(point)
        if enc is None:
            enc = self._encoded[point] = np.asarray(
                [f for sub, value in zip(self.subspaces, self.split(point))
                 for f in sub.encode(value)], dtype=np.float32)
        return enc


class WorkloadReplay:
    """One workload of a dataset, replayed (see the module docstring)."""

    def __init__(self, data: WorkloadData, surrogate: Surrogate):
        self.data = data
        self.surrogate = surrogate
        self.best = data.best
        self.extents = {k["name"]: int(k["extent"]) for k in data.meta["knobs"]}
        self.workload_features = np.asarray(data.meta["workload_features"], dtype=np.float32)
        self.layouts = [LayoutReplay(i, entry, np.flatnonzero(data.layout == i), data)
                        for i, entry in enumerate(data.layouts)]
        self._layout_vectors = [layout_vector(lay.factors, self.extents)
                                for lay in self.layouts]
        self._predicted: dict[tuple[int, Point], float] = {}
        self._logs = np.array([[math.log2(max(lay.factors.get(k, 1), 1))
                                for k in sorted(self.extents)] for lay in self.layouts])

    @property
    def name(self) -> str:
        return self.data.name

    def framework(self) -> LayoutReplay:
        return next((lay for lay in self.layouts if lay.framework), self.layouts[0])

    def nearest_layout(self, factors: dict[str, int]) -> tuple[LayoutReplay, bool]:
        """The dataset's layout nearest ``factors`` (in ``log2`` of every tile) and
        whether it is ``factors`` itself."""
        want = np.array([math.log2(max(factors.get(k, 1), 1)) for k in sorted(self.extents)])
        i = int(np.argmin(np.abs(self._logs - want).sum(axis=1)))
        lay = self.layouts[i]
        return lay, all(lay.factors.get(k) == factors.get(k) for k in self.extents)

    def latency(self, layout: LayoutReplay, point: Point, rng: np.random.Generator
                ) -> tuple[float, bool]:
        """Seconds for ``point`` of ``layout`` and whether they were replayed: one of its
        measured timings drawn at random (``inf`` if it failed), else the surrogate's
        prediction (calibrated where the surrogate has a calibration)."""
        row = layout.points.get(point)
        if row is not None:
            timings = self.data.latencies[row]
            if not len(timings):
                return math.inf, True
            return float(timings[int(rng.integers(len(timings)))]), True
        key = (layout.index, point)
        predicted = self._predicted.get(key)
        if predicted is None:
            x = point_features(self.workload_features, self._layout_vectors[layout.index],
                               layout.encode(point), point, layout.description)
            value = self.surrogate.value(self.name, x, program_key(layout.factors, point))
            predicted = self._predicted[key] = self.best / 2.0 ** value
        return predicted, False

    def layout_of(self, factors: dict[str, int]) -> LayoutReplay | None:
        """The dataset's layout with exactly these factors, if it holds one."""
        lay, exact = self.nearest_layout(factors)
        return lay if exact else None

    def predict(self, factors: dict[str, int], encoding: Sequence[float],
                decisions: Sequence[int], subspaces: Sequence[dict[str, Any]] | None,
                program: tuple[Surrogate, Sequence[int]] | None = None) -> float:
        """The surrogate's latency (s) of a point of any layout, in the dataset or not
        (``subspaces``: its loop space's ``describe()``; calibrated where it has one);
        ``program``: a program surrogate and the program's stored features, which then
        predicts instead."""
        x = point_features(self.workload_features, layout_vector(factors, self.extents),
                           np.asarray(encoding, dtype=np.float32), decisions, subspaces)
        if program is not None:
            model, features = program
            return self.best / 2.0 ** model.predict_one(program_input(x, features))
        return self.best / 2.0 ** self.surrogate.value(self.name, x,
                                                       program_key(factors, decisions))

    def features(self, layout: LayoutReplay, point: Point) -> np.ndarray:
        """The program features of ``point`` if measured, else those of the measured
        program of the layout nearest it (by decision encoding)."""
        row = layout.points.get(point)
        if row is None:
            if not len(layout.rows):
                return np.zeros(self.data.features.shape[1], dtype=np.float32)
            nearest = np.abs(layout.encodings - layout.encode(point)).sum(axis=1).argmin()
            row = layout.sampled[int(nearest)]
        return self.data.features[row]
