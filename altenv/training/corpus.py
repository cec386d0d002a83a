"""A measured corpus for a cross-workload cost model, and the model fitted to it.

A cost model trained only on the workload being tuned ranks its first batches at random;
one trained on many other workloads measured on the same CPU ranks them from the first
batch on (TenSet, TLP). :func:`measure_corpus` measures random joint-space candidates of
many drawn workloads (:func:`altenv.ops.draw.draw_workloads`) into one records file,
resumably; :func:`fit_cost_model` turns records files (the corpus, and any run's or bench
cell's) into one :class:`~altenv.costmodel.CostModel` over all their workloads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..costmodel import CostModel, extract_features
from ..measure import MeasureConfig, create
from ..records import Record, RecordDB
from ..space import StaleRecordError
from ..tuning import Budget, OpTask, SearchOptions, TuningJob, freeze


def split_key(key: str) -> tuple[str, tuple[str, ...]]:
    """A records workload key (``spec|bias+relu``) as its spec and epilogue."""
    spec, _, epilogue = key.partition("|")
    return spec, tuple(epilogue.split("+")) if epilogue else ()


def measure_corpus(specs: Sequence[str], trials: int, records: Path, target: Any,
                   measure: MeasureConfig, agent: Callable[[int], Any], seed: int = 0,
                   batch: int = 64, top_k: int = 8, progress: bool = True) -> int:
    """Measure ``trials`` candidates of each workload into ``records`` with the joint-stage
    search of ``agent(seed)`` (e.g. ``random``: a new random layout each batch,
    MetaSchedule-sampled loops, the online cost model's top-k of each batch, so the corpus
    holds fast and slow programs). Workloads already measured are skipped, so a killed
    corpus resumes. Returns the records measured in this call."""
    done = 0
    with create(None, measure, target) as measurer, RecordDB(records) as db:
        bar = tqdm(specs, desc="corpus", unit="workload", disable=not progress)
        for i, spec in enumerate(bar):
            task = OpTask(spec, target)
            job = TuningJob(task, agent(seed + i), Budget(trials, 0),
                            SearchOptions(batch=batch, top_k=top_k, finalists=0))
            session = job.session(measurer, db, CostModel(seed=seed + i))
            before = session.trials
            if before >= trials:
                continue
            job.run(session, progress=False)
            done += session.trials - before
            bar.set_postfix(workload=spec[:32], trials=session.trials)
    return done


@dataclass
class Examples:
    """Feature sets and latencies (s, ``inf`` failed) of one workload's records."""

    key: str
    features: list[np.ndarray]
    latencies: list[float]


def record_examples(paths: Iterable[Path], target: Any, workloads: Callable[[str], bool]
                    = lambda key: True, progress: bool = True) -> list[Examples]:
    """The features of every record in ``paths`` whose workload ``workloads`` accepts,
    one :class:`Examples` per workload. A record is replayed into its schedule (layout
    factors + loop decisions) on ``target``; records of intrinsic mappings and records a
    changed design space no longer replays are left out."""
    by_key: dict[str, list[Record]] = {}
    for path in paths:
        with RecordDB(path) as db:
            for record in db.records():
                if workloads(record.workload) and "mapping" not in record.layouts:
                    by_key.setdefault(record.workload, []).append(record)
    out = []
    for key, recs in tqdm(by_key.items(), desc="features", unit="workload",
                          disable=not progress):
        spec, epilogue = split_key(key)
        task = OpTask(spec, target, epilogue, cache_size=4)
        by_layout: dict[Any, list[Record]] = {}
        for record in recs:
            by_layout.setdefault(freeze(record.layouts["factors"]), []).append(record)
        examples = Examples(key, [], [])
        for factors, group in by_layout.items():
            space = task.space(factors)
            schedules, latencies = [], []
            for record in group:
                try:
                    schedule = space.decode(space.from_vector(record.decisions))
                except StaleRecordError:
                    continue
                if schedule is not None:
                    schedules.append(schedule)
                    latencies.append(record.median)
            examples.features += extract_features(space.context, schedules)
            examples.latencies += latencies
        if examples.features:
            out.append(examples)
    return out


def fit_cost_model(examples: Iterable[Examples], seed: int = 0, num_boost_round: int = 300
                   ) -> CostModel:
    """One cost model trained on every workload's examples (labels normalized per
    workload, as :class:`~altenv.costmodel.CostModel` always does)."""
    model = CostModel(seed=seed, num_boost_round=num_boost_round)
    for ex in examples:
        model.add(ex.key, ex.features, ex.latencies)
    model.fit()
    return model
