"""``altenv dataset collect CONFIG``: a dataset config's workloads, collected on this host,
on RPC devices (``measure.rpc``) or on a Ray cluster (``ray:``).

The workloads are the config's own specs, its drawn ones (never a benchmark suite's, so no
benchmark judges a model on data it was fitted to) and the complex tasks of its models;
:func:`altenv.dataset.collect.collect` measures them.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..bench.peak import host_peak
from ..config import DatasetConfig
from ..dataset.collect import Plan, Progress, collect
from ..dataset.workloads import name_workloads
from ..ops.workload import Workload
from ..suites import suite_specs
from .checks import check_device, load_user_model, make_agent
from .devices import open_measurer
from .preview import preview


def model_specs(model: str) -> list[str]:
    """The distinct specs of a model's complex calls that tuning covers with layouts
    (epilogues left out: a dataset times the operator itself)."""
    report = preview(load_user_model(model, {}, seed=0))
    return list(dict.fromkeys(c["spec"] for c in report["calls"] if c["tuned"]))


def dataset_workloads(cfg: DatasetConfig) -> list[tuple[str, Workload]]:
    """``(name, workload)`` of every workload of ``cfg``: listed, drawn, then the models'."""
    specs: list[str | Workload] = list(cfg.workloads)
    if cfg.draw is not None:
        specs += cfg.draw.draw(exclude=suite_specs() | {str(w) for w in cfg.workloads})
    for model in cfg.models:
        specs += model_specs(model)
    return name_workloads(specs)


def collect_dataset(cfg: DatasetConfig, progress: bool = True,
                    card: dict[str, Any] | None = None,
                    only: list[str] | None = None) -> tuple[Path, Progress]:
    """Collect (or resume) the dataset of ``cfg`` (of its workloads, those named in
    ``only`` where given); its directory and what this call did. The search agent is built
    and the Ray cluster of ``ray:`` joined before anything is written, and this host's
    roofline (for the card) measured before any worker starts."""
    check_device(cfg.target)
    c = cfg.collection
    make_agent(c.search_agent, {"seed": 0})  # a bad agent or option: one line, nothing written
    if cfg.ray is not None:
        from ..cluster.session import connect  # Ray only for a collection that names it

        connect(cfg.ray)
    plan = Plan(layouts=c.layouts, samples=c.samples, searched=c.searched, rounds=c.rounds,
                reference_every=c.reference_every, seed=cfg.seed, quiet_host=c.quiet_host,
                drift=c.drift, search_trials=c.search_trials, bests=c.bests,
                search_agent=c.search_agent.name)
    workloads = dataset_workloads(cfg)
    extra = {"config": cfg.model_dump(mode="json"), "roofline": asdict(host_peak(cfg.target)),
             **(card or {})}
    with open_measurer(cfg.ray, cfg.measure, cfg.target) as measurer:
        done = collect(cfg.output, workloads, plan, cfg.measure, cfg.target,
                       measurer=measurer, card=extra, progress=progress,
                       agent=lambda seed: make_agent(c.search_agent, {"seed": seed}),
                       only=only)
    return Path(cfg.output), done
