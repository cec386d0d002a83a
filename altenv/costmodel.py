"""XGBoost cost model on MetaSchedule's per-store features, normalized per workload.

ALT §5.2.3: a tree ensemble predicts the throughput of decoded points so that only the
top-k of a batch (8 of 128, §7) is measured on the device.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xgboost as xgb
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.cost_model.xgb_model import PackSum, XGBConfig

FAILED_COST = 1e10
"""Latency (s) recorded for a failed measurement: its label is then about zero."""


def top_k(scores: np.ndarray | Sequence[float], k: int = 8) -> np.ndarray:
    """Indices of the ``k`` highest scores, best first (ties: lower index first)."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    return order[: min(k, len(order))]


def extract_features(context: ms.TuneContext, schedules: Sequence[Schedule],
                     extractor: ms.feature_extractor.FeatureExtractor | None = None,
                     ) -> list[np.ndarray]:
    """MetaSchedule ``PerStoreFeature`` rows of each schedule: one float32 array of
    shape (stores, features) per schedule."""
    if not schedules:
        return []
    extractor = extractor or ms.feature_extractor.PerStoreFeature()
    candidates = [
        ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, True))
        for sch in schedules
    ]
    return [t.numpy().astype(np.float32) for t in extractor.extract_from(context, candidates)]


@dataclass
class _Group:
    """Records of one workload: per-record feature rows and latencies (s)."""

    features: list[np.ndarray] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

    def labels(self) -> np.ndarray:
        costs = np.asarray(self.costs, dtype=np.float64)
        return (costs.min() / costs).astype(np.float32)


class CostModel:
    """XGBoost throughput model trained online from measured records.

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
    """

    def __init__(
        self,
        config: XGBConfig | None = None,
        num_boost_round: int = 100,
        early_stopping_rounds: int = 20,
        retrain_growth: float = 0.2,
        seed: int = 0,
    ) -> None:
        config = config or XGBConfig()
        if config.nthread is None:
            config = config._replace(nthread=1)
        self.config = config
        self.num_boost_round = num_boost_round
        self.early_stopping_rounds = early_stopping_rounds
        self.retrain_growth = retrain_growth
        self.booster: xgb.Booster | None = None
        self._groups: dict[str, _Group] = {}
        self._trained_size = 0
        self._rng = np.random.default_rng(seed)

    @property
    def num_records(self) -> int:
        """Records the model has been given."""
        return sum(len(g.costs) for g in self._groups.values())

    @property
    def is_trained(self) -> bool:
        """Whether a booster exists (before that :meth:`predict` is random)."""
        return self.booster is not None

    def update(self, workload: str, features: Sequence[np.ndarray],
               latencies: Sequence[float | None]) -> None:
        """Add measured records of ``workload`` and retrain. A latency that is None,
        non-finite or non-positive marks a failed measurement."""
        if len(features) != len(latencies):
            raise ValueError(f"update: {len(features)} feature sets, {len(latencies)} latencies")
        group = self._groups.setdefault(workload, _Group())
        for feats, lat in zip(features, latencies, strict=True):
            if len(feats) == 0:
                continue
            ok = lat is not None and math.isfinite(lat) and lat > 0
            group.features.append(np.asarray(feats, dtype=np.float32))
            group.costs.append(float(lat) if ok else FAILED_COST)
        size = self.num_records
        if size and size >= self._trained_size * (1 + self.retrain_growth):
            self._train()

    def predict(self, features: Sequence[np.ndarray]) -> np.ndarray:
        """Predicted throughput relative to the best seen for the workload (higher is
        better), one per feature set; uniform random before the first training."""
        n = len(features)
        if self.booster is None or n == 0:
            return self._rng.uniform(size=n)
        keep = [i for i, f in enumerate(features) if len(f)]
        scores = np.zeros(n)
        if keep:
            pack = PackSum([features[i] for i in keep], None)
            pred = self.booster.predict(pack.dmatrix)
            scores[keep] = np.bincount(pack.ids, weights=pred, minlength=len(keep))
        return scores

    def _train(self) -> None:
        xs = [f for g in self._groups.values() for f in g.features]
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
        )
        self._trained_size = self.num_records

    def save(self, path: str | Path) -> None:
        """Write booster, records and settings to one ``.npz`` file (no pickle)."""
        names = list(self._groups)
        feats = [f for g in self._groups.values() for f in g.features]
        settings = {
            "config": self.config.to_dict(),
            "num_boost_round": self.num_boost_round,
            "early_stopping_rounds": self.early_stopping_rounds,
            "retrain_growth": self.retrain_growth,
            "trained_size": self._trained_size,
            "workloads": names,
        }
        booster = (np.frombuffer(bytes(self.booster.save_raw("ubj")), dtype=np.uint8)
                   if self.booster is not None else np.zeros(0, dtype=np.uint8))
        with open(path, "wb") as fh:
            np.savez_compressed(
                fh,
                settings=np.array(json.dumps(settings)),
                rows=np.concatenate(feats) if feats else np.zeros((0, 0), np.float32),
                counts=np.array([len(f) for f in feats], dtype=np.int64),
                costs=np.array([c for g in self._groups.values() for c in g.costs]),
                group=np.repeat(np.arange(len(names)),
                                [len(g.costs) for g in self._groups.values()]),
                booster=booster,
            )

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read a model written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as data:
            settings = json.loads(str(data["settings"]))
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
        model._trained_size = settings["trained_size"]
        return model
