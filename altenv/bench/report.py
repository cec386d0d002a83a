"""Benchmark reports: ``results.csv``, a printed table with geometric means, and plots.

Rows come from the ``timing.json`` files of ``bench ops`` / ``bench net``: one row per
(entry, tuner, seed) with its re-timed median latency, spread, trials, tuning seconds,
its speedup over each baseline and over each reference tuner at the same seed
(MetaSchedule by default, ``--versus`` for others, e.g. ``random``), and the trials it
took to reach each reference's final tuning-time latency. A timing whose spread (interquartile
range over median of its rounds) is above
:data:`~altenv.measure.timing.NOISY_SPREAD` is too spread to trust: the ``noisy``
column names the contenders of a row's numbers (its program, the baselines, MetaSchedule at
its seed) that are, and the printed table marks them and the speedups built on them
with ``*``.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..measure.timing import NOISY_SPREAD

if TYPE_CHECKING:
    from .peak import Peak

METASCHEDULE = "metaschedule"


def _noisy(program: dict[str, Any] | None) -> bool:
    return program is not None and program["spread"] > NOISY_SPREAD


def roof(timing: dict[str, Any], peak: Peak | None) -> tuple[float, float, str]:
    """``(FLOPs, attainable GFLOP/s, what bounds it)`` of an operator timing on ``peak``'s
    roofline (``"flop"``, or the bandwidth of ``"L1"``, ``"L2"``, ``"mem"``); ``(nan, nan,
    "")`` for a network, another host's timing or a non-fp32 op."""
    from ..ops import parse_workload
    from ..ops.operators import operator_for
    from .peak import operator_traffic

    if peak is None or "spec" not in timing or timing.get("target") != peak.target:
        return math.nan, math.nan, ""
    workload = parse_workload(timing["spec"])  # as timing.json stores it
    if operator_for(workload).dtype != "float32":
        return math.nan, math.nan, ""
    flops, nbytes = operator_traffic(workload, timing.get("epilogue") or ())
    return (flops, *peak.bound(flops, nbytes))


def rows_of(timings: Sequence[dict[str, Any]], baselines: Sequence[str],
            versus: Sequence[str] = (METASCHEDULE,), peak: Peak | None = None
            ) -> list[dict[str, Any]]:
    """One row per tuned program of each timing (entries in order); ``versus``: the
    reference tuners, compared at the same seed; ``peak``: the host's roofline, for the
    ``gflops`` and ``roof_fraction`` columns (the fraction of the roofline reached)."""
    rows = []
    for timing in timings:
        programs = timing["programs"]
        flops, attainable, bound = roof(timing, peak)
        for label, cell in timing["cells"].items():
            median = programs[label]["median_s"]
            row = {"workload": timing["workload"], "tuner": cell["tuner"], "seed": cell["seed"],
                   "median_ms": median * 1e3, "spread": programs[label]["spread"],
                   "trials": cell["trials"], "tuning_s": cell["tuning_seconds"],
                   "s_per_trial": cell["tuning_seconds"] / max(cell["trials"], 1)}
            for part, seconds in (cell.get("seconds_per_trial") or {}).items():
                row[f"s_per_trial_{part}"] = seconds
            if bound:
                row.update(gflops=flops / median / 1e9,
                           roof_fraction=flops / median / 1e9 / attainable, bound=bound)
            for name in baselines:
                base = programs.get(name)
                row[f"speedup_vs_{name}"] = base["median_s"] / median if base else math.nan
            for ref in versus:
                other = programs.get(f"{ref}#{cell['seed']}")
                row[f"speedup_vs_{ref}"] = other["median_s"] / median if other else math.nan
                ref_cell = timing["cells"].get(f"{ref}#{cell['seed']}")
                row[f"time_per_trial_vs_{ref}"] = (
                    row["s_per_trial"] * ref_cell["trials"] / ref_cell["tuning_seconds"]
                    if ref_cell and ref_cell.get("tuning_seconds") else math.nan)
                row[_trials_to(ref)] = (trials_to_reach(cell["history"], ref_cell["history"][-1])
                                        if ref_cell and ref_cell["history"] else math.nan)
            row["noisy"] = " ".join(name for name in dict.fromkeys(
                [label, *baselines, *(f"{ref}#{cell['seed']}" for ref in versus)])
                if _noisy(programs.get(name)))
            row["agent"] = " ".join(f"{k}={v}" for k, v in _flat(cell.get("agent", {})))
            row.update(cell.get("extra", {}))
            rows.append(row)
    return rows


def _trials_to(ref: str) -> str:
    """The column of the trials to reach ``ref``'s best (``trials_to_ms_best`` as before)."""
    return "trials_to_ms_best" if ref == METASCHEDULE else f"trials_to_{ref}_best"


def _flat(summary: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """An agent's summary (:meth:`agents.base.Agent.summary`) as ``key.sub=value`` pairs."""
    out: list[tuple[str, Any]] = []
    for key, value in summary.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((prefix + key, value))
    return out


def trials_to_reach(history: Sequence[float], target: float) -> float:
    """The first trial (1-based) whose best tuning-time latency is within 1% of ``target``
    (MetaSchedule's final best at the same seed: search efficiency); ``inf`` if never."""
    for i, best in enumerate(history):
        if best <= target * 1.01:
            return float(i + 1)
    return math.inf


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """``rows`` as CSV (floats with 6 significant digits)."""
    fields = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                             for k, v in row.items()})


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of the finite positive values (``nan`` if none)."""
    good = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(map(math.log, good)) / len(good)) if good else math.nan


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per tuner: geometric mean (over workloads, seeds pooled) of each speedup column,
    and the spread of the per-workload speedups (min and max)."""
    columns = [k for k in rows[0] if k.startswith("speedup_vs_")] if rows else []
    out: dict[str, dict[str, float]] = {}
    for tuner in dict.fromkeys(r["tuner"] for r in rows):
        mine = [r for r in rows if r["tuner"] == tuner]
        stats: dict[str, float] = {}
        for col in columns:
            per_workload: dict[str, list[float]] = defaultdict(list)
            for r in mine:
                per_workload[r["workload"]].append(r[col])
            medians = [statistics.median(v) for v in per_workload.values()
                       if all(math.isfinite(x) for x in v)]
            stats[col] = geomean(medians)
            stats[col + "_min"] = min(medians) if medians else math.nan
            stats[col + "_max"] = max(medians) if medians else math.nan
        out[tuner] = stats
    return out


def format_table(timings: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]],
                 baselines: Sequence[str], versus: Sequence[str] = (METASCHEDULE,),
                 peak: Peak | None = None) -> str:
    """The printed table: each workload's median latency per tuner (median over seeds),
    the baselines' latencies, the fraction of ``peak``'s roofline the fastest of them
    reaches (``flop``: FLOP-bound, ``L1``/``L2``/``mem``: bound by that bandwidth), then
    the geometric-mean speedups per tuner."""
    if not rows:
        return "(no finished workloads)\n"
    tuners = list(dict.fromkeys(r["tuner"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    by = defaultdict(list)
    for r in rows:
        by[r["workload"], r["tuner"]].append(r)
    width = max(len(w) for w in workloads + [f"geomean x vs {r}" for r in versus]) + 2
    col = 22
    roofs = {t["workload"]: roof(t, peak) for t in timings}
    with_roof = any(bound for _, _, bound in roofs.values())
    lines = [f"{'latency (ms)':<{width}}" + "".join(f"{t[:col - 2]:>{col}s}" for t in
                                                   [*tuners, *baselines])
             + (f"{'best % roof':>{col}s}" if with_roof else "")]
    for w in workloads:
        programs = next(t["programs"] for t in timings if t["workload"] == w)
        medians = [programs[b]["median_s"] * 1e3 for b in baselines if b in programs]
        cells = []
        for t in tuners:
            vals = [r["median_ms"] for r in by[w, t]]
            noisy = any(_rests_on_noise(r, None) for r in by[w, t])
            if vals:
                medians.append(statistics.median(vals))
            cells.append(_cell(statistics.median(vals), noisy, col) if vals else f"{'-':>{col}s}")
        cells += [_cell(programs[b]["median_s"] * 1e3, _noisy(programs[b]), col)
                  if b in programs else f"{'-':>{col}s}" for b in baselines]
        flops, attainable, bound = roofs[w]
        if with_roof:
            text = f"{flops / min(medians) / 1e6 / attainable:.0%} {bound}" if bound else "-"
            cells.append(f"{text:>{col}s}")
        lines.append(f"{w:<{width}}" + "".join(cells))
    stats = summary(rows)
    for name in [*baselines, *versus]:
        key = f"speedup_vs_{name}"
        cells = []
        for t in tuners:
            s = stats[t]
            mark = "*" if any(_rests_on_noise(r, name) for r in rows
                              if r["tuner"] == t and math.isfinite(r[key])) else ""
            text = (f"{s[key]:.3g}{mark} [{s[key + '_min']:.2g}, {s[key + '_max']:.2g}]"
                    if math.isfinite(s[key]) else "-")
            cells.append(f"{text:>{col}s}")
        lines.append(f"{'geomean x vs ' + name:<{width}}" + "".join(cells))
    lines += _time_lines(rows, tuners, versus, width, col)
    lines.append("(speedups: geometric mean over workloads of the median over seeds; "
                 "[min, max] over workloads)")
    if with_roof:
        levels = ", ".join(f"{level} {gbs:.0f}" for level, _, gbs in peak.cache_gbs)
        lines.append(f"(% roof: the fastest program's GFLOP/s over min({peak.gflops:.0f} "
                     f"GFLOP/s, FLOP/byte x the GB/s of the smallest level its tensors fit "
                     f"in: {levels}, mem {peak.gbs:.1f}), this host's `altenv bench peak`; "
                     "flop: FLOP-bound, else the level whose bandwidth bounds it)")
    if any(r["noisy"] for r in rows):
        lines.append(f"(*: a timing too spread to trust, interquartile range / median above "
                     f"{NOISY_SPREAD}, or a speedup built on one: re-time on a quieter host "
                     "with --retime; the noisy column of results.csv names them)")
    return "\n".join(lines) + "\n"


SPLIT = ("search", "cost_model", "measure_wall", "finalists")
"""The parts of an agent's tuning time the table prints per trial."""


def _time_lines(rows: Sequence[dict[str, Any]], tuners: Sequence[str],
                versus: Sequence[str], width: int, col: int) -> list[str]:
    """The tuning seconds per trial of each tuner (median over cells, [min, max]), their
    ratio to each reference tuner's at the same seed (geometric mean over workloads of the
    median over seeds) and, for agents, where their time went."""
    lines = []
    cells = []
    for t in tuners:
        vals = [r["s_per_trial"] for r in rows if r["tuner"] == t]
        cells.append(f"{statistics.median(vals):.3g} [{min(vals):.2g}, {max(vals):.2g}]")
    lines.append(f"{'tuning s per trial':<{width}}" + "".join(f"{c:>{col}s}" for c in cells))
    for ref in versus:
        key, cells = f"time_per_trial_vs_{ref}", []
        for t in tuners:
            per_workload: dict[str, list[float]] = defaultdict(list)
            for r in rows:
                if r["tuner"] == t and math.isfinite(r.get(key, math.nan)):
                    per_workload[r["workload"]].append(r[key])
            ratio = geomean([statistics.median(v) for v in per_workload.values()])
            cells.append(f"{ratio:.3g}" if math.isfinite(ratio) else "-")
        lines.append(f"{'time/trial x ' + ref:<{width}}" + "".join(f"{c:>{col}s}" for c in cells))
    for t in tuners:
        mine = [r for r in rows if r["tuner"] == t and f"s_per_trial_{SPLIT[0]}" in r]
        if mine:
            parts = ", ".join(
                f"{part.replace('_', ' ')} "
                f"{statistics.median(r[f's_per_trial_{part}'] for r in mine):.3g}"
                for part in SPLIT)
            lines.append(f"({t}, s per trial, median over cells: {parts})")
    return lines


def _cell(value: float, noisy: bool, width: int) -> str:
    text = f"{value:.4g}{'*' if noisy else ''}"
    return f"{text:>{width}s}"


def _rests_on_noise(row: dict[str, Any], contender: str | None) -> bool:
    """Whether the row's own timing, or (``contender``: a baseline or MetaSchedule) its
    speedup over that contender, rests on a timing too spread to trust."""
    noisy = set(row["noisy"].split())
    own = f"{row['tuner']}#{row['seed']}"
    return own in noisy or contender in noisy or f"{contender}#{row['seed']}" in noisy


def plot(timings: Sequence[dict[str, Any]], rows: Sequence[dict[str, Any]], output: Path,
         reference: str) -> list[Path]:
    """``speedup.png``: per-workload bars of each tuner's speedup over ``reference`` (a
    baseline, median over seeds); ``convergence.png``: best latency vs trials per tuner
    (median over seeds), one panel per workload, when the cells have histories (operators,
    not networks)."""
    import matplotlib  # 0.35 s, for the plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    tuners = list(dict.fromkeys(r["tuner"] for r in rows))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    col = f"speedup_vs_{reference}"
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(workloads) * max(len(tuners), 1) / 2), 4))
    width = 0.8 / max(len(tuners), 1)
    for i, t in enumerate(tuners):
        vals = [statistics.median([r[col] for r in rows if r["workload"] == w and
                                   r["tuner"] == t] or [math.nan]) for w in workloads]
        ax.bar(np.arange(len(workloads)) + i * width, vals, width, label=t)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(np.arange(len(workloads)) + width * (len(tuners) - 1) / 2)
    ax.set_xticklabels(workloads, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(f"speedup over {reference}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(output / "speedup.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    if not any(c["history"] for timing in timings for c in timing["cells"].values()):
        return paths  # networks: no per-trial latency of the whole network to plot
    cols = min(3, len(timings))
    nrows = math.ceil(len(timings) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, timing in zip(axes.flat, timings):
        for t in tuners:
            histories = [c["history"] for c in timing["cells"].values() if c["tuner"] == t
                         and c["history"]]
            if not histories:
                continue
            n = min(len(h) for h in histories)
            curve = np.median(np.array([h[:n] for h in histories]), axis=0) * 1e3
            ax.plot(np.arange(1, n + 1), curve, label=t)
        ax.set_title(timing["workload"], fontsize=9)
        ax.set_xlabel("measured trials")
        ax.set_ylabel("best latency (ms)")
        ax.set_yscale("log")
    for ax in list(axes.flat)[len(timings):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    paths.append(output / "convergence.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def report(timings: Sequence[dict[str, Any]], output: Path, baselines: Sequence[str],
           versus: Sequence[str] = (METASCHEDULE,), peak: Peak | None = None) -> str:
    """Write ``results.csv`` and the plots into ``output``; returns the printed table
    (speedups over the ``baselines`` and the reference tuners ``versus``, the fraction of
    ``peak``'s roofline reached)."""
    rows = rows_of(timings, baselines, versus, peak)
    write_csv(rows, output / "results.csv")
    if rows:
        plot(timings, rows, output, baselines[0] if baselines else versus[0])
    return format_table(timings, rows, baselines, versus, peak)
