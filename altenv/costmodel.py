"""XGBoost cost model on MetaSchedule's per-store features, normalized per workload.

ALT §5.2.3: a tree ensemble predicts the throughput of decoded points so that only the
top-k of a batch (8 of 128, §7) is measured on the device. Each store's row also
describes the loop nest around the program's main computation (:func:`loop_nest_features`),
which MetaSchedule's features leave out.
"""

from __future__ import annotations

import io
import json
import math
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xgboost as xgb
from tvm import tirx
from tvm.s_tir import SBlockRealize, Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum, XGBConfig

from .files import MB, read_bytes, replacing

MODEL_LIMIT = 512 * MB
"""Largest saved cost model read (one with a 2,000-trial run's records is a few MB)."""
FAILED_COST = 1e10
"""Latency (s) recorded for a failed measurement: its label is then about zero."""

PER_STORE_FEATURES = 164
"""Length of MetaSchedule's ``PerStoreFeature`` row."""
NEST_LOOPS = 12
"""Loops of the main computation's nest that :func:`loop_nest_features` describes."""
NEST_FEATURES = 3
"""Features per loop: log2(extent + 1), whether it is a reduction loop, its kind."""
FEATURE_LENGTH = PER_STORE_FEATURES + NEST_LOOPS * NEST_FEATURES
"""Length of one row of :func:`extract_features`."""
FEATURE_SCALE = 64.0
"""Per-store features are log2-scaled counts; dividing by this maps them into [0, 1]."""


def top_k(scores: np.ndarray | Sequence[float], k: int = 8) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first (ties: lower index first)."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    return order[: min(k, len(order))]


def extract_features(context: ms.TuneContext, schedules: Sequence[Schedule],
                     extractor: ms.feature_extractor.FeatureExtractor | None = None,
                     ) -> list[np.ndarray]:
    """Features of each schedule: one float32 array of shape (stores,
    :data:`FEATURE_LENGTH`), MetaSchedule's ``PerStoreFeature`` row of each buffer store
    followed by the program's :func:`loop_nest_features`."""
    if not schedules:
        return []
    extractor = extractor or ms.feature_extractor.PerStoreFeature()
    candidates = [
        ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, True))
        for sch in schedules
    ]
    rows = [t.numpy().astype(np.float32) for t in extractor.extract_from(context, candidates)]
    return [np.hstack([r, np.tile(loop_nest_features(sch), (len(r), 1))])
            for r, sch in zip(rows, schedules, strict=True)]


def feature_summary(features: np.ndarray) -> np.ndarray:
    """Mean and max over stores of one program's per-store features, in [0, 1]
    (length ``2 * FEATURE_LENGTH``): a fixed-length view of a program of any size."""
    if len(features) == 0:
        return np.zeros(2 * FEATURE_LENGTH, dtype=np.float32)
    summary = np.concatenate([features.mean(axis=0), features.max(axis=0)]) / FEATURE_SCALE
    return np.clip(summary, 0.0, 1.0).astype(np.float32)


def feature_bytes(features: np.ndarray) -> np.ndarray:
    """:func:`feature_summary` as a dataset stores it (``uint8``, x 255), so that a program
    a search generates reads as the dataset's programs do."""
    return np.round(feature_summary(features) * 255).astype(np.uint8)


def loop_nest_features(sch: Schedule) -> np.ndarray:
    """The :data:`NEST_LOOPS` innermost loops around the program's main computation (the
    block with a reduction and the deepest nest), innermost first: ``log2(extent + 1)``,
    whether the loop's variable feeds a reduction axis, and its kind (``ForKind + 1``);
    zeros where the nest is shallower.

    MetaSchedule's per-store features summarize each store's accesses, not the order and
    split of the loops around it: of 200 measured programs of a grouped convolution (one
    layout), 29 that differed only in where the spatial and reduction loops were split
    had identical features, with latencies from 0.50 to 2.02 ms, so the cost model could
    not tell them apart."""
    func = next(f for f in sch.mod.functions.values() if isinstance(f, tirx.PrimFunc))
    nests: list[tuple[SBlockRealize, list[tirx.For]]] = []
    _collect_nests(func.body, [], nests)
    reducing = [n for n in nests if any(int(iv.iter_type) == tirx.IterVar.CommReduce
                                        for iv in n[0].block.iter_vars)]
    out = np.zeros((NEST_LOOPS, NEST_FEATURES), dtype=np.float32)
    if not nests:
        return out.ravel()
    realize, loops = max(reducing or nests, key=lambda n: len(n[1]))
    reduction = {v.name for iv, value in zip(realize.block.iter_vars, realize.iter_values,
                                             strict=True)
                 if int(iv.iter_type) == tirx.IterVar.CommReduce
                 for v in tirx.analysis.undefined_vars(value, [])}
    for row, loop in zip(out, reversed(loops[-NEST_LOOPS:])):
        extent = loop.extent.value if isinstance(loop.extent, tirx.IntImm) else 0
        row[:] = (math.log2(extent + 1), loop.loop_var.name in reduction, int(loop.kind) + 1)
    return out.ravel()


def _collect_nests(stmt: tirx.Stmt, loops: list[tirx.For],
                   out: list[tuple[SBlockRealize, list[tirx.For]]]) -> None:
    """Every block realization under ``stmt`` with the loops around it, outermost first."""
    if isinstance(stmt, SBlockRealize):
        out.append((stmt, loops))
        _collect_nests(stmt.block.body, loops, out)
    elif isinstance(stmt, tirx.For):
        _collect_nests(stmt.body, [*loops, stmt], out)
    elif isinstance(stmt, tirx.SeqStmt):
        for child in stmt.seq:
            _collect_nests(child, loops, out)
    elif isinstance(stmt, tirx.IfThenElse):
        _collect_nests(stmt.then_case, loops, out)
        if stmt.else_case is not None:
            _collect_nests(stmt.else_case, loops, out)
    elif hasattr(stmt, "body"):
        _collect_nests(stmt.body, loops, out)


@dataclass
class _Group:
    """Records of one workload: per-record feature rows and latencies (s)."""

    features: list[np.ndarray] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

    def labels(self) -> np.ndarray:
        costs = np.asarray(self.costs, dtype=np.float64)
        return (costs.min() / costs).astype(np.float32)


class CostModel:
    """XGBoost throughput model trained online from measured records, optionally on top
    of a pretrained cross-workload model.

    Features are MetaSchedule's ``PerStoreFeature`` rows (one per buffer store) and the
    training format is MetaSchedule's pack-sum (``PackSum``: a program's score is the
    sum of its stores' scores, trained with its weighted square error). MetaSchedule's
    ``XGBModel`` itself is not wrapped: it normalizes each record by the best latency of
    its ``TuneContext.mod``, and a layout change is a different module, so every layout
    would be scored relative to its own best. Here records are grouped by a caller's
    workload key (one operator, any layout), the label is the best latency seen for
    that workload over the record's latency, and scores are comparable across layouts.

    Parameters
    ----------
    config : XGBConfig
        Booster parameters (MetaSchedule's defaults; ``nthread`` None means 1: the
        record sets are small, and two OpenMP threads on a busy 2-core machine trained
        20x slower than one).
    num_boost_round : int
        Upper bound on boosting rounds.
    early_stopping_rounds : int
        Stop when the training p-rmse has not improved for this many rounds.
    retrain_growth : float
        Retrain only once the record count grew by this fraction since the last
        training (0 retrains on every update), as MetaSchedule's adaptive training.
    seed : int
        Seed of the random scores returned before the first training.
    base : CostModel, optional
        A pretrained model (e.g. :func:`altenv.pretrained.cost_model`) this one starts
        from: it predicts with the base until it has records, and each training adds trees
        that correct the base on its own records (boosting continued from the base's
        margins), so a new workload is ranked by what other workloads taught from the
        first batch on, and by its own measurements as they come.
    base_warmup : int
        Records before trees are added to a base: on 14 held-out workloads of the shipped
        corpus, trees fitted to a workload's first 16 records lowered the base's rank
        correlation on its later records from 0.36 to 0.25 (best of the top 8: 0.89 to
        0.79), while after 32 they matched it (0.93 against 0.93).
    """

    def __init__(
        self,
        config: XGBConfig | None = None,
        num_boost_round: int = 100,
        early_stopping_rounds: int = 20,
        retrain_growth: float = 0.2,
        seed: int = 0,
        base: CostModel | None = None,
        base_warmup: int = 32,
    ) -> None:
        config = config or XGBConfig()
        if config.nthread is None:
            config = config._replace(nthread=1)
        if base is not None and base.booster is None:
            raise ValueError("cost model: base= must be a trained model")
        self.config = config
        self.num_boost_round = num_boost_round
        self.early_stopping_rounds = early_stopping_rounds
        self.retrain_growth = retrain_growth
        self.base = base.booster if base is not None else None
        self.base_warmup = base_warmup
        self.booster: xgb.Booster | None = self.base
        self._groups: dict[str, _Group] = {}
        self._trained_size = 0
        self._rng = np.random.default_rng(seed)
        self._lock = threading.RLock()  # a network's sessions may tune in several threads

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles (Gymnasium copies an env spec's kwargs) get a lock of their own."""
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def num_records(self) -> int:
        """Records the model has been given."""
        return sum(len(g.costs) for g in self._groups.values())

    @property
    def is_trained(self) -> bool:
        """Whether a booster exists (before that :meth:`predict` is random)."""
        return self.booster is not None

    def adopt(self, base: CostModel) -> None:
        """Start from the trained ``base`` from now on (see the ``base`` parameter), keeping
        this model's records: a model shared by a run's sessions takes a pretrained base
        in place. Nothing changes when it has a base already."""
        if self.base is not None:
            return
        if base.booster is None:
            raise ValueError("cost model: adopt() needs a trained model")
        self.base = self.booster = base.booster
        if self.num_records:
            self.fit()

    @property
    def workloads(self) -> list[str]:
        """Workload keys of the records, in the order they came."""
        return list(self._groups)

    def add(self, workload: str, features: Sequence[np.ndarray],
            latencies: Sequence[float | None]) -> None:
        """Add measured records of ``workload`` without training. A latency that is None,
        non-finite or non-positive marks a failed measurement."""
        with self._lock:
            self._add(workload, features, latencies)

    def _add(self, workload: str, features: Sequence[np.ndarray],
             latencies: Sequence[float | None]) -> None:
        if len(features) != len(latencies):
            raise ValueError(f"update: {len(features)} feature sets, {len(latencies)} latencies")
        group = self._groups.setdefault(workload, _Group())
        for feats, lat in zip(features, latencies, strict=True):
            if len(feats) == 0:
                continue
            ok = lat is not None and math.isfinite(lat) and lat > 0
            group.features.append(np.asarray(feats, dtype=np.float32))
            group.costs.append(float(lat) if ok else FAILED_COST)

    def update(self, workload: str, features: Sequence[np.ndarray],
               latencies: Sequence[float | None]) -> None:
        """:meth:`add` the records, then retrain once the record count grew by
        ``retrain_growth`` since the last training."""
        with self._lock:
            self._add(workload, features, latencies)
            size = self.num_records
            if size and size >= self._trained_size * (1 + self.retrain_growth):
                self.fit()

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """Predicted throughput relative to the best seen for the workload (higher is
        better), one per feature set; uniform random before the first training."""
        n = len(features)
        booster = self.booster
        if booster is None or n == 0:
            with self._lock:
                return self._rng.uniform(size=n)
        keep = [i for i, f in enumerate(features) if len(f)]
        scores = np.zeros(n)
        if keep:  # PackSum's sum of store scores, without its DMatrix (slow for a few rows)
            rows = np.concatenate([features[i] for i in keep]).astype(np.float32, copy=False)
            ids = np.repeat(np.arange(len(keep)), [len(features[i]) for i in keep])
            pred = booster.inplace_predict(rows)
            scores[keep] = np.bincount(ids, weights=pred, minlength=len(keep))
        return scores

    def fit(self) -> None:
        """Train on every record (continuing from :attr:`base` where there is one, once
        there are ``base_warmup`` records)."""
        with self._lock:
            self._fit()

    def _fit(self) -> None:
        xs = [f for g in self._groups.values() for f in g.features]
        if not xs or (self.base is not None and len(xs) < self.base_warmup):
            return
        ys = np.concatenate([g.labels() for g in self._groups.values() if g.costs])
        pack = PackSum(xs, ys)
        params = {**self.config.to_dict(), "disable_default_eval_metric": 1}
        self.booster = xgb.train(
            params,
            pack.dmatrix,
            num_boost_round=self.num_boost_round,
            evals=[(pack.dmatrix, "tr")],
            obj=lambda pred, _: pack.obj_square_error(pred),
            custom_metric=lambda pred, _: pack.rmse(pred),
            early_stopping_rounds=self.early_stopping_rounds,
            verbose_eval=False,
            xgb_model=self.base,
        )
        self._trained_size = self.num_records

    def save(self, path: str | Path, records: bool = True) -> None:
        """Write booster, records and settings to one ``.npz`` file (no pickle); without
        ``records`` only the booster and settings (a model to ship, e.g. as a ``base``)."""
        groups = self._groups if records else {}
        names = list(groups)
        feats = [f for g in groups.values() for f in g.features]
        settings = {
            "config": self.config.to_dict(),
            "num_boost_round": self.num_boost_round,
            "early_stopping_rounds": self.early_stopping_rounds,
            "retrain_growth": self.retrain_growth,
            "trained_size": self._trained_size if records else 0,
            "workloads": names,
            "feature_length": FEATURE_LENGTH,
        }
        booster = (np.frombuffer(bytes(self.booster.save_raw("ubj")), dtype=np.uint8)
                   if self.booster is not None else np.zeros(0, dtype=np.uint8))
        with replacing(path) as fh:  # never through a link in a run directory
            np.savez_compressed(
                fh,
                settings=np.array(json.dumps(settings)),
                rows=np.concatenate(feats) if feats else np.zeros((0, 0), np.float32),
                counts=np.array([len(f) for f in feats], dtype=np.int64),
                costs=np.array([c for g in groups.values() for c in g.costs]),
                group=np.repeat(np.arange(len(names)),
                                [len(g.costs) for g in groups.values()]),
                booster=booster,
            )

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a model written by :meth:`save` (as data: arrays and JSON, a link or a file
        that is not such a model is refused); raises ``ValueError`` of one line naming the
        file for a damaged model or one whose features are not this version's
        (:data:`FEATURE_LENGTH`)."""
        try:
            return cls._load(path)
        except (KeyError, TypeError, IndexError, EOFError, OSError, zipfile.BadZipFile,
                xgb.core.XGBoostError, ValueError) as err:
            if isinstance(err, ValueError) and str(err).startswith(f"{path}:"):
                raise
            raise ValueError(f"{path}: not a cost model altenv wrote ({type(err).__name__}: "
                             f"{' '.join(str(err).split())[:120]})") from None

    @classmethod
    def _load(cls, path: str | Path) -> CostModel:
        with np.load(io.BytesIO(read_bytes(path, MODEL_LIMIT)), allow_pickle=False) as data:
            settings = json.loads(str(data["settings"]))
            length = settings.get("feature_length", PER_STORE_FEATURES)
            if length != FEATURE_LENGTH:
                raise ValueError(f"{path}: a cost model on {length} features per store, but "
                                 f"this altenv extracts {FEATURE_LENGTH}; tune again to train "
                                 "a new one")
            model = cls(
                config=XGBConfig(**settings["config"]),
                num_boost_round=settings["num_boost_round"],
                early_stopping_rounds=settings["early_stopping_rounds"],
                retrain_growth=settings["retrain_growth"],
            )
            bounds = np.cumsum(data["counts"])[:-1]
            feats = np.split(data["rows"], bounds) if len(data["counts"]) else []
            for feat, cost, g in zip(feats, data["costs"], data["group"], strict=True):
                group = model._groups.setdefault(settings["workloads"][g], _Group())
                group.features.append(feat)
                group.costs.append(float(cost))
            if data["booster"].size:
                model.booster = xgb.Booster(model_file=bytearray(data["booster"].tobytes()))
                # a loaded booster predicts on every core; OpenMP's spinning threads made
                # one small prediction 70x slower on a busy 2-core machine
                model.booster.set_param({"nthread": model.config.nthread})
        model._trained_size = settings["trained_size"]
        return model
