"""A surrogate of a dataset: the latency of a program the dataset does not hold.

A replay answers a program the dataset measured with one of its timings; any other point
(a layout's loop point no collection drew) needs a prediction, and it must come without
lowering the program, or a replay step would cost what a cost-model step costs. So the
surrogate reads only what a point is: the workload (``workload_features``), the layout
(every knob role's tile as ``log2``, with its extent) and the loop decisions
(``LoopSpace.encode``, as TLP reads schedule primitives instead of programs), and an
XGBoost ensemble maps them to ``log2`` of the program's throughput relative to the best
program of its workload (NAS-Bench-301's surrogate, fitted on a dense sample of the
space). :func:`evaluate` reports what matters for search: per workload, the Spearman
rank correlation and top-8 recall on programs held out of the fit.

A regression's predictions are shrunk towards a workload's typical program: on programs
held out of the fit, those within 25 % of a workload's best were predicted 1.8x slower
(``log2`` -0.82 for a measured -0.11), and a search whose every trial is predicted never
reports a fast program. An optional :class:`Calibration` restores the measured spread: a
prediction is mapped through the workload's out-of-fold prediction quantiles onto its
measured quantiles (the ranking is kept), plus a share of the out-of-fold residual as
noise drawn once per program. It brings offline regret near the device's level, but with
noise it reversed which agent wins (docs/datasets.md, offline against hardware), so the
shipped dataset replays uncalibrated.

A second model, the **program surrogate**, reads the same point plus the program's
feature summary (what the dataset stores of MetaSchedule's per-store features, see
:func:`program_rows`). Only a search that generated the program can give those (an
offline bench cell's session does; a gym replay steps through points without programs),
so it answers the measurements of ``bench offline`` and the point surrogate everything
else. On the hardware trials of six 200-trial searches no collection drew, it ranked
programs better than the point model (Spearman 0.72 against 0.68) and shrank the fastest
less (docs/datasets.md).

The models are saved as XGBoost's own UBJSON, gzipped, and the calibration as JSON:
loading them runs no code.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb

from ..ops.templates import KNOB_ROLES
from ..training.ranking import spearman
from .store import Dataset, WorkloadData

LOOP_WIDTH = 96
"""Loop decision encodings are padded (or cut) to this many entries."""
FLOOR = -8.0
"""The lowest label: ``log2`` of a throughput 256 times below the workload's best (and
that of a failed program)."""
PARAMS = {"max_depth": 10, "eta": 0.1, "subsample": 0.9, "colsample_bytree": 0.5,
          "min_child_weight": 2, "objective": "reg:squarederror", "nthread": 1}
"""Deeper trees on half the columns each: held-out Spearman 0.802 mean over three splits of
17 workloads, against 0.781 with depth 8 on 80 % of the columns."""
ROUNDS = 400
FILE = "surrogate.ubj.gz"
"""XGBoost's own model format (UBJSON, data only), gzipped: a quarter of its JSON's size."""
PROGRAM_FILE = "surrogate-program.ubj.gz"
"""The program surrogate (:func:`program_rows`), in the same format."""
CALIBRATION = "surrogate-calibration.json"
"""The :class:`Calibration` beside the model, where there is one."""
QUANTILES = 101


def layout_vector(factors: dict[str, int], extents: dict[str, int]) -> np.ndarray:
    """Per knob role: ``log2`` of the tile and of the extent (/12), and whether the
    workload has that knob."""
    out = np.zeros(3 * len(KNOB_ROLES), dtype=np.float32)
    for i, role in enumerate(KNOB_ROLES):
        if role in factors:
            out[3 * i:3 * i + 3] = (math.log2(max(factors[role], 1)) / 12,
                                    math.log2(max(extents[role], 1)) / 12, 1.0)
    return out


def loop_summary(subspaces: Sequence[dict[str, Any]], decisions: Sequence[int]
                 ) -> np.ndarray:
    """What decides a loop point's speed, read from its decisions and its space's
    description (``LoopSpace.describe``): ``log2`` of the spatial tiles at each of their
    four levels summed over dims (the outermost is the parallel extent, the innermost the
    register block), the vectorized tile (the innermost dim's innermost), the reduction
    tiles at both levels, the register, L1- and L2-sized tile volumes, the unroll depth
    and the mean compute location; /16. MetaSchedule tiles spatial dims in four levels and
    reductions in two on CPUs (``SSRSRS``)."""
    spatial: list[list[int]] = []
    reduction: list[list[int]] = []
    unroll, locations, at = 0.0, [], 0
    for sub in subspaces:
        value = [int(v) for v in decisions[at:at + int(sub["size"])]]
        at += int(sub["size"])
        if sub["type"] == "TileSubspace":
            (spatial if int(sub["levels"]) >= 3 else reduction).append(
                [max(v, 1) for v in value])
        elif sub["type"] == "CategoricalSubspace" and value:
            candidates = sub.get("candidates") or []
            if 0 <= value[0] < len(candidates):
                unroll = max(unroll, math.log2(1 + int(candidates[value[0]])))
        elif sub["type"] == "ComputeLocationSubspace" and value:
            locations.append(value[0])

    def level(tiles: list[list[int]], i: int) -> float:
        return sum(math.log2(t[i]) for t in tiles if len(t) > i)

    s = [level(spatial, i) for i in range(4)]
    r = [level(reduction, i) for i in range(2)]
    vector = math.log2(spatial[-1][-1]) if spatial else 0.0
    out = [*s, vector, *r, s[3] + r[1], s[2] + s[3] + r[1], s[1] + s[2] + s[3] + r[1],
           unroll, float(np.mean(locations)) + 2 if locations else 0.0]
    return np.asarray(out, dtype=np.float32) / 16


SUMMARY = 12
"""Length of :func:`loop_summary`."""


def point_features(workload: np.ndarray, layout: np.ndarray, encoding: np.ndarray,
                   decisions: Sequence[int], subspaces: Sequence[dict[str, Any]] | None
                   ) -> np.ndarray:
    """One row of the surrogate's input: the workload, the layout, the loop point's
    encoding (tiles relative to their extent), its decisions as sizes (``log2`` of each
    tile, whose absolute size decides vector width and cache fit) and its
    :func:`loop_summary` (zeros where the space's description is unknown)."""
    loop = np.zeros(2 * LOOP_WIDTH, dtype=np.float32)
    n = min(len(encoding), LOOP_WIDTH)
    loop[:n] = encoding[:n]
    sizes = np.log2(np.abs(np.asarray(decisions[:LOOP_WIDTH], dtype=np.float32)) + 1) / 12
    loop[LOOP_WIDTH:LOOP_WIDTH + len(sizes)] = sizes
    summary = (loop_summary(subspaces, decisions) if subspaces is not None
               else np.zeros(SUMMARY, dtype=np.float32))
    return np.concatenate([workload, layout, loop, summary]).astype(np.float32)


def workload_rows(w: WorkloadData) -> tuple[np.ndarray, np.ndarray]:
    """Inputs and labels (``log2(best / latency)``, floored) of a workload's programs."""
    extents = {k["name"]: int(k["extent"]) for k in w.meta["knobs"]}
    feats = np.asarray(w.meta["workload_features"], dtype=np.float32)
    layouts = [layout_vector(lay["factors"], extents) for lay in w.layouts]
    x = np.stack([point_features(feats, layouts[li], enc, dec, w.layouts[li]["subspaces"])
                  for li, enc, dec in zip(w.layout, w.encoding, w.decisions)]
                 ) if len(w) else np.zeros((0, 0))
    with np.errstate(divide="ignore"):
        y = np.maximum(np.log2(w.best / w.latency), FLOOR)
    return x, np.where(np.isfinite(y), y, FLOOR).astype(np.float32)


def program_rows(w: WorkloadData) -> tuple[np.ndarray, np.ndarray]:
    """:func:`workload_rows` with each program's feature summary appended to its point."""
    x, y = workload_rows(w)
    return (np.concatenate([x, w.features], axis=1) if len(y) else x), y


def program_input(point: np.ndarray, features: Sequence[int]) -> np.ndarray:
    """A program surrogate's row from a point's row and the program's stored feature
    summary (``altenv.costmodel.feature_bytes``)."""
    return np.concatenate([point, np.asarray(features, dtype=np.float32) / 255.0])


class TreeEnsemble:
    """A fitted XGBoost regressor as arrays, evaluated in numpy: every tree walked at once,
    one level per step. XGBoost's own prediction of a single row costs about a
    millisecond of call overhead, a replay step's whole budget; this costs tens of
    microseconds and gives the same numbers (``x < split`` goes left; inputs are dense)."""

    def __init__(self, booster: xgb.Booster):
        model = json.loads(booster.save_raw("json"))["learner"]
        trees = model["gradient_booster"]["model"]["trees"]
        width = max(len(t["left_children"]) for t in trees)

        def table(key: str, fill: float, dtype: Any) -> np.ndarray:
            out = np.full((len(trees), width), fill, dtype=dtype)
            for i, t in enumerate(trees):
                out[i, :len(t[key])] = t[key]
            return out

        self.left = table("left_children", -1, np.int64)
        self.right = table("right_children", -1, np.int64)
        self.feature = table("split_indices", 0, np.int64)
        self.split = table("split_conditions", 0.0, np.float32)
        self.base = float(model["learner_model_param"]["base_score"].strip("[]"))
        self.depth = self._depth()
        self._offsets = np.arange(len(trees), dtype=np.int64) * width
        children = [np.where(t >= 0, t + self._offsets[:, None], -1)
                    for t in (self.left, self.right)]
        self._flat_left, self._flat_right = (c.ravel() for c in children)
        self._flat_feature, self._flat_split = self.feature.ravel(), self.split.ravel()

    def _depth(self) -> int:
        depth, frontier = 0, np.zeros(len(self.left), dtype=np.int64)
        rows = np.arange(len(self.left))
        while True:
            inner = self.left[rows, frontier] >= 0
            if not inner.any():
                return depth
            frontier = np.where(inner, self.left[rows, frontier], frontier)
            depth += 1
            if depth > 64:  # deeper than any tree this fits; guards a corrupt model
                return depth

    def predict_one(self, x: np.ndarray) -> float:
        x = np.asarray(x, dtype=np.float32)
        left, right = self._flat_left, self._flat_right
        at = self._offsets.copy()  # flat index of each tree's current node
        for _ in range(self.depth):
            go = np.where(x[self._flat_feature[at]] < self._flat_split[at], left[at], right[at])
            at = np.where(left[at] >= 0, go, at)
        return self.base + float(self._flat_split[at].sum(dtype=np.float64))


@dataclass
class Calibration:
    """Per workload, what turns a prediction into a replayed value: the quantiles of its
    programs' out-of-fold predictions and of their measured labels (a prediction is mapped
    from the one onto the other), and the spread of the out-of-fold residuals, of which
    ``noise`` is added to each program as a normal draw seeded by the program itself (so
    a program keeps its value in every replay)."""

    predicted: dict[str, np.ndarray]
    measured: dict[str, np.ndarray]
    residual: dict[str, float]
    noise: float

    def value(self, workload: str, prediction: float, program: Any) -> float:
        """The calibrated ``log2`` relative throughput of ``program`` (any hashable
        identity of it) predicted at ``prediction``; the prediction itself for a workload
        the calibration does not know."""
        if workload not in self.predicted:
            return prediction
        value = float(np.interp(prediction, self.predicted[workload], self.measured[workload]))
        spread = self.noise * self.residual[workload]
        if spread:
            seed = zlib.crc32(repr((workload, program)).encode())
            value += spread * float(np.random.default_rng(seed).standard_normal())
        return min(value, 0.0)

    @classmethod
    def fit(cls, out_of_fold: dict[str, tuple[np.ndarray, np.ndarray]],
            noise: float) -> Calibration:
        """From each workload's out-of-fold predictions and labels (:func:`out_of_fold`)."""
        qs = np.linspace(0.0, 1.0, QUANTILES)
        predicted, measured, residual = {}, {}, {}
        for name, (p, y) in out_of_fold.items():
            if len(y) < 2:
                continue
            # strictly increasing, so that ties among predictions still interpolate
            predicted[name] = np.maximum.accumulate(np.quantile(p, qs)) + qs * 1e-6
            measured[name] = np.quantile(y, qs)
            mapped = np.interp(p, predicted[name], measured[name])
            residual[name] = float(np.std(y - mapped))
        return cls(predicted, measured, residual, noise)

    def to_json(self) -> dict[str, Any]:
        return {"noise": self.noise, "quantiles": QUANTILES, "workloads": {
            name: {"predicted": np.round(self.predicted[name], 5).tolist(),
                   "measured": np.round(self.measured[name], 5).tolist(),
                   "residual": round(self.residual[name], 5)} for name in self.predicted}}

    @classmethod
    def from_json(cls, entry: dict[str, Any]) -> Calibration:
        w = entry["workloads"]
        return cls({n: np.asarray(v["predicted"], dtype=np.float64) for n, v in w.items()},
                   {n: np.asarray(v["measured"], dtype=np.float64) for n, v in w.items()},
                   {n: float(v["residual"]) for n, v in w.items()}, float(entry["noise"]))


class Surrogate:
    """The fitted model; :meth:`predict` gives ``log2`` relative throughputs (at most 0),
    :meth:`value` the calibrated value a replay answers with."""

    def __init__(self, booster: xgb.Booster, calibration: Calibration | None = None):
        self.booster = booster
        self.calibration = calibration
        self._fast = TreeEnsemble(booster)

    @classmethod
    def fit(cls, parts: Iterable[tuple[np.ndarray, np.ndarray]], seed: int = 0,
            rounds: int = ROUNDS) -> Surrogate:
        xs, ys = zip(*[(x, y) for x, y in parts if len(y)])
        train = xgb.DMatrix(np.concatenate(xs), label=np.concatenate(ys))
        return cls(xgb.train({**PARAMS, "seed": seed}, train, num_boost_round=rounds))

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predictions of the rows of ``x`` (XGBoost's batch prediction)."""
        return np.minimum(self.booster.inplace_predict(np.atleast_2d(x)), 0.0)

    def predict_one(self, x: np.ndarray) -> float:
        """The prediction of one row, fast (:class:`TreeEnsemble`)."""
        return min(self._fast.predict_one(x), 0.0)

    def value(self, workload: str, x: np.ndarray, program: Any) -> float:
        """What a replay answers for ``program`` of ``workload`` (features ``x``): the
        prediction, calibrated where the surrogate has a :class:`Calibration`."""
        prediction = self.predict_one(x)
        if self.calibration is None:
            return prediction
        return self.calibration.value(workload, prediction, program)

    def save(self, path: str | Path) -> None:
        """Write the model as gzipped UBJSON (:data:`FILE`), atomically."""
        path = Path(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(gzip.compress(bytes(self.booster.save_raw("ubj")), mtime=0))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path, calibrated: bool = True) -> Surrogate:
        """The model at ``path``, with the :class:`Calibration` beside it if there is one
        and ``calibrated`` (the calibration is the point surrogate's)."""
        path = Path(path)
        booster = xgb.Booster()
        booster.load_model(bytearray(gzip.decompress(path.read_bytes())))
        booster.set_param({"nthread": 1})
        beside = path.with_name(CALIBRATION)
        calibration = (Calibration.from_json(json.loads(beside.read_text()))
                       if calibrated and beside.is_file() else None)
        return cls(booster, calibration)


def top_recall(truth: Sequence[float], predicted: Sequence[float], k: int = 8) -> float:
    """Of the ``k`` best programs by ``truth``, the fraction among the ``k`` best predicted."""
    k = min(k, len(truth))
    best = set(np.argsort(-np.asarray(truth), kind="mergesort")[:k])
    chosen = set(np.argsort(-np.asarray(predicted), kind="mergesort")[:k])
    return len(best & chosen) / k if k else 0.0


@dataclass
class Accuracy:
    """Held-out accuracy on one workload."""

    workload: str
    programs: int
    spearman: float
    recall: float


Rows = Callable[[WorkloadData], tuple[np.ndarray, np.ndarray]]


def evaluate(data: Dataset, holdout: float = 0.2, seed: int = 0, rounds: int = ROUNDS,
             rows: Rows = workload_rows) -> tuple[list[Accuracy], Surrogate]:
    """Fit on ``1 - holdout`` of every workload's valid programs and measure, per workload,
    the Spearman correlation and top-8 recall of the held-out rest; then the surrogate
    fitted on everything (what a replay uses). ``rows``: the point surrogate's inputs
    (:func:`workload_rows`) or the program surrogate's (:func:`program_rows`)."""
    rng = np.random.default_rng(seed)
    train, test = [], []
    for w in data:
        x, y = rows(w)
        ok = np.flatnonzero(np.isfinite(w.latency))
        held = rng.random(len(y)) < holdout
        train.append((x[~held], y[~held]))
        keep = np.intersect1d(np.flatnonzero(held), ok)
        test.append((w.name, x[keep], y[keep]))
    model = Surrogate.fit(train, seed, rounds)
    scores = [Accuracy(name, len(y), spearman(y, model.predict(x)),
                       top_recall(y, model.predict(x)))
              for name, x, y in test if len(y) >= 2]
    full = Surrogate.fit((rows(w) for w in data), seed, rounds)
    return scores, full


def out_of_fold(data: Dataset, folds: int = 5, seed: int = 0, rounds: int = ROUNDS
                ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per workload: every program's prediction by a surrogate fitted without it (``folds``
    fits, each leaving out a random fold of every workload), and its label."""
    rows = {w.name: workload_rows(w) for w in data}
    rng = np.random.default_rng(seed)
    fold = {name: rng.integers(0, folds, len(y)) for name, (_, y) in rows.items()}
    predicted = {name: np.zeros(len(y)) for name, (_, y) in rows.items()}
    for k in range(folds):
        model = Surrogate.fit(((x[fold[n] != k], y[fold[n] != k]) for n, (x, y) in rows.items()),
                              seed, rounds)
        for name, (x, _) in rows.items():
            held = fold[name] == k
            if held.any():
                predicted[name][held] = model.predict(x[held])
    return {name: (predicted[name], y) for name, (_, y) in rows.items()}


def write_calibration(data: Dataset, calibration: Calibration) -> None:
    (data.path / CALIBRATION).write_text(json.dumps(calibration.to_json()) + "\n")


def format_accuracy(scores: Sequence[Accuracy]) -> str:
    lines = [f"{'workload':10s} {'held out':>8s} {'spearman':>8s} {'top-8 recall':>12s}"]
    lines += [f"{s.workload:10s} {s.programs:8d} {s.spearman:8.3f} {s.recall:12.3f}"
              for s in scores]
    if scores:
        lines.append(f"{'median':10s} {int(np.median([s.programs for s in scores])):8d} "
                     f"{np.nanmedian([s.spearman for s in scores]):8.3f} "
                     f"{np.median([s.recall for s in scores]):12.3f}")
    return "\n".join(lines) + "\n"


def load_or_fit(data: Dataset, seed: int = 0) -> Surrogate:
    """The dataset's saved surrogate, or one fitted now on all of it."""
    path = data.path / FILE
    if path.is_file():
        return Surrogate.load(path)
    return Surrogate.fit((workload_rows(w) for w in data), seed)  # uncalibrated


def load_program(data: Dataset) -> Surrogate | None:
    """The dataset's saved program surrogate, if it has one (``dataset surrogate`` fits
    it beside the point surrogate)."""
    path = data.path / PROGRAM_FILE
    return Surrogate.load(path, calibrated=False) if path.is_file() else None


def card_entry(scores: Sequence[Accuracy], holdout: float, seed: int) -> dict[str, Any]:
    return {"holdout": holdout, "seed": seed, "workloads": len(scores),
            "median_spearman": float(np.nanmedian([s.spearman for s in scores])),
            "median_top8_recall": float(np.median([s.recall for s in scores])),
            "per_workload": {s.workload: [round(s.spearman, 4), round(s.recall, 4)]
                             for s in scores}}


def write_card_entry(data: Dataset, entry: dict[str, Any]) -> None:
    path = data.path / "surrogate-accuracy.json"
    path.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
