"""``altenv bench agree``: does the offline bench predict the hardware?

A verdict reached offline is only worth its agreement with the device. This compares a
``bench offline`` run with a ``bench ops`` run of the same agents, on the same dataset
workloads, at the same budget. The hardware run has the dataset's best programs as a tuner
(``dataset_best``, named in ``--versus``), so every pick is re-timed interleaved with the
dataset's best on the same host and day; a pick's **ratio** is its latency over the
dataset's best: ``1 + regret`` offline, the re-timed ratio on hardware. Per (workload,
agent) cell the ratio is the median over seeds. Reported:

- every cell's ratio offline and on hardware;
- Kendall's tau of the agents' ranking (by the geometric mean of their cells' ratios)
  offline against hardware, and pooled over the cells;
- per agent, how far its offline geometric-mean ratio is from the hardware's, and the same
  for its ratios over another agent's (``random``'s) on each workload, where a bias all
  agents share cancels;
- the surrogate on the hardware's own trials (the program surrogate, which a replay in
  ``bench offline`` answers with, where the dataset has one): for every program the
  hardware cells measured that the dataset does not hold (the points a search visits,
  which no collection drew),
  the Spearman correlation per cell and the median ``log2`` of replayed over measured
  latency (its bias), calibrated and not; and a cell's fastest replayed value over its
  fastest measurement: the bias a replay of the very same trials would carry into its
  regret.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import kendalltau

from ..costmodel import extract_features
from ..dataset import Dataset
from ..dataset.measurer import ReplayMeasurer
from ..dataset.surrogate import Surrogate
from ..measure import ProgramPoint
from ..records import RecordDB
from ..space.loop_space import StaleRecordError
from ..training.ranking import spearman
from ..tuning.session import program_point, with_features
from ..tuning.task import Candidate, Factors, OpTask, freeze
from .report import geomean, rows_of

DATA_URI = "altenv://"


def offline_ratios(path: Path, budget: int) -> dict[tuple[str, str], list[float]]:
    """``(workload, tuner) -> [1 + regret per seed]`` of a ``bench offline`` results CSV
    (rows of other budgets are left out)."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            if int(row["budget"]) == budget:
                out[row["workload"], row["tuner"]].append(1.0 + float(row["regret"]))
    return dict(out)


def dataset_name(data: Dataset, spec: str) -> str | None:
    """The dataset workload a ``timing.json``'s spec (or ``altenv://`` URI) names."""
    if spec.startswith(DATA_URI):
        owner, _, name = spec[len(DATA_URI):].partition("/")
        return name if owner == data.name else None
    return data.name_of(spec)


def hardware_timings(data: Dataset, directory: Path) -> dict[str, dict[str, Any]]:
    """The re-timed workloads of a ``bench ops`` directory, by dataset workload name."""
    out = {}
    for path in sorted(directory.glob("*/timing.json")):
        timing = json.loads(path.read_text())
        name = dataset_name(data, timing["spec"])
        if name is not None:
            out[name] = {**timing, "dir": path.parent}
    return out


def hardware_ratios(timings: dict[str, dict[str, Any]], reference: str
                    ) -> dict[tuple[str, str], list[float]]:
    """``(workload, tuner) -> [latency / reference's latency at the same seed]``."""
    out: dict[tuple[str, str], list[float]] = defaultdict(list)
    for name, timing in timings.items():
        for row in rows_of([timing], [], versus=[reference]):
            speedup = row[f"speedup_vs_{reference}"]
            if row["tuner"] != reference and math.isfinite(speedup):
                out[name, row["tuner"]].append(1.0 / speedup)
    return dict(out)


def surrogate_on_trials(data: Dataset, timings: dict[str, dict[str, Any]], reference: str
                        ) -> list[dict[str, Any]]:
    """Per hardware cell: the surrogate's predictions of the programs it measured that the
    dataset does not hold, against their measured medians (module docstring)."""
    measurer = ReplayMeasurer(data)
    raw = (ReplayMeasurer(data, surrogate=Surrogate(measurer.surrogate.booster))
           if measurer.surrogate.calibration is not None else None)
    out = []
    for timing in timings.values():
        task = OpTask(timing["spec"], measurer.target)
        for cell in timing["cells"].values():
            records = (timing["dir"] / f"{cell['tuner'].replace(':', '.')}-seed{cell['seed']}"
                       / "records.jsonl")
            if cell["tuner"] == reference or not records.is_file():
                continue
            predicted, uncalibrated, measured = [], [], []
            held, pick = 0, (math.inf, math.nan)
            for program, median in _trials(task, records, measurer.reads_features):
                value, _, replayed = measurer.answer(program)
                if replayed:
                    held += 1
                    continue
                predicted.append(value)
                uncalibrated.append(value if raw is None else raw.answer(program)[0])
                measured.append(median)
                if median < pick[0]:
                    pick = (median, value)
            if not measured:
                continue
            out.append({"workload": dataset_name(data, timing["spec"]), "tuner": cell["tuner"],
                        "seed": cell["seed"], "predicted": len(measured), "in_dataset": held,
                        "bias_log2": float(np.median(np.log2(np.divide(predicted, measured)))),
                        "uncalibrated_bias_log2": float(np.median(
                            np.log2(np.divide(uncalibrated, measured)))),
                        "spearman": spearman(np.asarray(measured), np.asarray(uncalibrated)),
                        "pick_error_log2": (math.log2(pick[1] / pick[0])
                                            if math.isfinite(pick[0]) else math.nan),
                        "best_error_log2": math.log2(min(predicted) / min(measured)),
                        "uncalibrated_best_error_log2": math.log2(min(uncalibrated)
                                                                  / min(measured))})
    return out


def _trials(task: OpTask, records: Path, features: bool
            ) -> list[tuple[ProgramPoint, float]]:
    """The measured programs of a records file and their medians; with their programs'
    features (as a tuning session gives them to a replay) if ``features``."""
    by_layout: dict[Factors, list[tuple[Candidate, float]]] = defaultdict(list)
    with RecordDB(records) as db:
        for record in db.records():
            if not math.isfinite(record.median):
                continue
            factors = freeze(record.layouts["factors"])
            try:
                point = task.space(factors).from_vector(record.decisions)
            except StaleRecordError:
                continue
            by_layout[factors].append((Candidate(factors, point), record.median))
    out = []
    for factors, trials in by_layout.items():
        space = task.space(factors)
        programs = [program_point(task, c) for c, _ in trials]
        if features:
            feats = extract_features(space.context, [space.decode(c.point) for c, _ in trials])
            programs = [with_features(p, f) for p, f in zip(programs, feats, strict=True)]
        out += [(p, median) for p, (_, median) in zip(programs, trials)]
    return out


def agreement(offline: dict[tuple[str, str], list[float]],
              hardware: dict[tuple[str, str], list[float]], relative_to: str = "random"
              ) -> dict[str, Any]:
    """Cells both runs have; the agents' ranking and pooled Kendall's tau; per agent the
    offline and hardware geometric-mean ratios and their relative difference, and the same
    for its ratios over those of ``relative_to`` on each workload (a bias every agent
    shares cancels there)."""
    keys = sorted(set(offline) & set(hardware))
    cells = [{"workload": w, "tuner": t, "offline": statistics.median(offline[w, t]),
              "hardware": statistics.median(hardware[w, t]),
              "offline_seeds": len(offline[w, t]), "hardware_seeds": len(hardware[w, t])}
             for w, t in keys]
    tuners = sorted({c["tuner"] for c in cells})
    workloads = sorted({c["workload"] for c in cells})
    complete = [w for w in workloads if all((w, t) in offline and (w, t) in hardware
                                            for t in tuners)]
    at = {(c["workload"], c["tuner"]): c for c in cells}
    per_tuner = []
    for t in tuners:
        mine = [c for c in cells if c["tuner"] == t and c["workload"] in complete]
        off, hw = (geomean([c[side] for c in mine]) for side in ("offline", "hardware"))
        row = {"tuner": t, "workloads": len(mine), "offline": off, "hardware": hw,
               "difference": off / hw - 1.0}
        if relative_to in tuners:
            rel_off, rel_hw = (geomean([c[side] / at[c["workload"], relative_to][side]
                                        for c in mine]) for side in ("offline", "hardware"))
            row.update(relative_offline=rel_off, relative_hardware=rel_hw,
                       relative_difference=rel_off / rel_hw - 1.0)
        per_tuner.append(row)

    def tau(a: Sequence[float], b: Sequence[float]) -> float:
        return float(kendalltau(a, b).statistic) if len(a) >= 2 else math.nan

    pooled = [c for c in cells if c["workload"] in complete]
    return {"cells": cells, "tuners": per_tuner, "workloads": complete,
            "relative_to": relative_to,
            "ranking_tau": tau([p["offline"] for p in per_tuner],
                               [p["hardware"] for p in per_tuner]),
            "pooled_tau": tau([c["offline"] for c in pooled], [c["hardware"] for c in pooled]),
            "per_workload_tau": statistics.mean(
                [tau([c["offline"] for c in pooled if c["workload"] == w],
                     [c["hardware"] for c in pooled if c["workload"] == w])
                 for w in complete]) if complete and len(tuners) >= 2 else math.nan}


def format_agreement(result: dict[str, Any], trials: Sequence[dict[str, Any]]) -> str:
    lines = [f"{'workload':10s} {'tuner':14s} {'offline':>8s} {'hardware':>8s}  "
             "(latency over the dataset's best; median over seeds)"]
    lines += [f"{c['workload']:10s} {c['tuner']:14s} {c['offline']:8.3f} {c['hardware']:8.3f}"
              for c in result["cells"]]
    lines.append("")
    rel = result["relative_to"]
    lines.append(f"{'tuner':14s} {'workloads':>9s} {'offline':>8s} {'hardware':>8s} "
                 f"{'difference':>10s}  {'over ' + rel + ':':>14s} {'offline':>8s} "
                 f"{'hardware':>8s} {'difference':>10s}  (geometric means)")
    for p in result["tuners"]:
        line = (f"{p['tuner']:14s} {p['workloads']:9d} {p['offline']:8.3f} {p['hardware']:8.3f} "
                f"{p['difference']:+10.1%}")
        if "relative_offline" in p:
            line += (f"  {'':14s} {p['relative_offline']:8.3f} {p['relative_hardware']:8.3f} "
                     f"{p['relative_difference']:+10.1%}")
        lines.append(line)
    lines.append(f"Kendall tau: agents' ranking {result['ranking_tau']:.2f}, pooled over "
                 f"cells {result['pooled_tau']:.2f}, within a workload (mean) "
                 f"{result['per_workload_tau']:.2f}")
    if trials:
        lines.append("")
        lines.append("surrogate on the hardware trials the dataset does not hold: "
                     f"{sum(t['predicted'] for t in trials)} programs "
                     f"({sum(t['in_dataset'] for t in trials)} others were in the dataset)")
        calibrated = any(t["bias_log2"] != t["uncalibrated_bias_log2"] for t in trials)
        lines.append(f"  Spearman of the surrogate per cell, median "
                     f"{np.nanmedian([t['spearman'] for t in trials]):.2f}; median over cells "
                     "of log2(replayed / measured)" + (", calibrated (uncalibrated):"
                                                       if calibrated else ":"))
        for label, key in (("every program", "bias_log2"),
                           ("a cell's fastest replayed over its fastest measured (the bias "
                            "a replay of the same trials carries into its regret)",
                            "best_error_log2")):
            raw = statistics.median(t["uncalibrated_" + key] for t in trials)
            lines.append(f"    {label}: {statistics.median(t[key] for t in trials):+.2f}"
                         + (f" ({raw:+.2f})" if calibrated else ""))
    return "\n".join(lines) + "\n"


def plot_agreement(result: dict[str, Any], path: Path, title: str) -> None:
    """Each cell's hardware ratio against its offline ratio, ``y = x`` and a 15 % band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(5, 5))
    for tuner in sorted({c["tuner"] for c in result["cells"]}):
        mine = [c for c in result["cells"] if c["tuner"] == tuner]
        ax.scatter([c["offline"] for c in mine], [c["hardware"] for c in mine], label=tuner)
    values = [v for c in result["cells"] for v in (c["offline"], c["hardware"])]
    span = np.geomspace(min(values) / 1.1, max(values) * 1.1, 50)
    ax.plot(span, span, color="grey", lw=1)
    ax.fill_between(span, span / 1.15, span * 1.15, color="grey", alpha=0.15)
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.set_xlabel("offline: latency / dataset best")
    ax.set_ylabel("hardware: latency / dataset best (re-timed)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_agreement(result: dict[str, Any], trials: Sequence[dict[str, Any]],
                    output: Path) -> None:
    """``agree.csv`` (one row per cell) and ``agree-trials.csv`` (the surrogate per
    hardware cell) in ``output``."""
    output.mkdir(parents=True, exist_ok=True)
    for name, rows in (("agree.csv", result["cells"]), ("agree-trials.csv", trials)):
        if rows:
            with (output / name).open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
