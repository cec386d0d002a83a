"""How well a cost model ranks the programs of workloads it was not trained on.

A cost model is only used to pick which few of a batch to measure, so what matters is
its ranking within one workload: the rank correlation of predicted and measured
throughput, and how close the best of its top-k comes to the workload's best. The report
compares, on held-out workloads, the pretrained model alone, a model trained online on
the workload's first records only (what a run without pretraining has after its first
batches), the pretrained model continued on those records, and random picks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..costmodel import CostModel
from .corpus import Examples

VARIANTS = ("pretrained", "online", "pretrained+online", "random")


def spearman(scores: np.ndarray, throughput: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); ``nan`` for constant input."""
    def ranks(x: np.ndarray) -> np.ndarray:
        order = np.argsort(x, kind="stable")
        r = np.empty(len(x))
        r[order] = np.arange(len(x))
        for value in np.unique(x):  # ties share their mean rank
            tied = x == value
            r[tied] = r[tied].mean()
        return r

    a, b = ranks(np.asarray(scores, float)), ranks(np.asarray(throughput, float))
    if a.std() == 0 or b.std() == 0:
        return math.nan
    return float(np.corrcoef(a, b)[0, 1])


def best_of_top(scores: np.ndarray, latencies: np.ndarray, k: int) -> float:
    """The workload's best latency over the best latency among the ``k`` highest-scored
    programs: 1 when the top-k holds the best program."""
    top = np.argsort(-np.asarray(scores), kind="stable")[:k]
    return float(latencies.min() / latencies[top].min())


def random_best_of_top(latencies: np.ndarray, k: int, draws: int = 2000, seed: int = 0
                       ) -> float:
    """:func:`best_of_top` of ``k`` random picks, averaged over ``draws``."""
    rng = np.random.default_rng(seed)
    return float(np.mean([best_of_top(rng.uniform(size=len(latencies)), latencies, k)
                          for _ in range(draws)]))


@dataclass
class RankingReport:
    """Per variant (:data:`VARIANTS`), the mean over held-out workloads of Spearman's rho
    and of :func:`best_of_top` with ``k`` picks, on each workload's records after its
    first ``online`` (those are what the online variants train on)."""

    workloads: int
    records: int
    online: int
    k: int
    spearman: dict[str, float]
    best_of_top: dict[str, float]

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    def table(self) -> str:
        lines = [f"held-out ranking quality: {self.workloads} workloads, {self.records} "
                 f"records; online models see each workload's first {self.online}",
                 f"{'model':20s} {'spearman':>9s} {f'best of top-{self.k}':>14s}"]
        for v in VARIANTS:
            lines.append(f"{v:20s} {self.spearman[v]:9.3f} {self.best_of_top[v]:14.3f}")
        return "\n".join(lines)


def ranking_report(base: CostModel, held_out: Sequence[Examples], online: int = 32,
                   k: int = 8, seed: int = 0) -> RankingReport:
    """Rank each held-out workload's records (those after its first ``online``, in the
    order they were measured) with each variant of :data:`VARIANTS`."""
    rho: dict[str, list[float]] = {v: [] for v in VARIANTS}
    top: dict[str, list[float]] = {v: [] for v in VARIANTS}
    records = 0
    for ex in held_out:
        lat = np.asarray(ex.latencies, dtype=float)
        ok = np.isfinite(lat) & (lat > 0)
        first, rest = np.arange(len(lat)) < online, np.arange(len(lat)) >= online
        test = np.flatnonzero(rest & ok)
        if len(test) <= k or not ok[first].any():
            continue
        records += len(test)
        feats = [ex.features[i] for i in test]
        train_f = [ex.features[i] for i in np.flatnonzero(first)]
        train_l = [ex.latencies[i] for i in np.flatnonzero(first)]
        models = {"pretrained": base, "online": CostModel(seed=seed),
                  "pretrained+online": CostModel(seed=seed, base=base)}
        for name in ("online", "pretrained+online"):
            models[name].add(ex.key, train_f, train_l)
            models[name].fit()
        rng = np.random.default_rng(seed)
        scores = {name: m.predict(feats) for name, m in models.items()}
        scores["random"] = rng.uniform(size=len(test))
        for name, s in scores.items():
            value = spearman(s, 1.0 / lat[test])
            if not math.isnan(value):
                rho[name].append(value)
            top[name].append(random_best_of_top(lat[test], k, seed=seed) if name == "random"
                             else best_of_top(s, lat[test], k))
    count = len(top["random"])
    mean = lambda xs: float(np.mean(xs)) if xs else math.nan  # noqa: E731
    return RankingReport(count, records, online, k, {v: mean(rho[v]) for v in VARIANTS},
                         {v: mean(top[v]) for v in VARIANTS})
