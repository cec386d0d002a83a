"""What a finished run reports: its result, altenv's speedups over the baselines, and the
table ``altenv tune`` and ``make demo`` print, with timings too spread to trust flagged."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..measure.timing import NOISY_SPREAD


@dataclass
class RunResult:
    """What a finished run reports."""

    run_dir: Path
    best_latency: float
    trials: int
    resumed_records: int
    tuning_seconds: float
    max_rel_err: float
    timings: dict[str, dict[str, float]]


def speedups(timings: dict[str, dict[str, Any]]) -> dict[str, float]:
    """altenv's speedup over each other contender of ``timings`` (median over median);
    where either is ``noisy`` (:data:`~altenv.measure.timing.NOISY_SPREAD`) the ratio is
    not to be trusted (:func:`timing_table` marks it)."""
    ours = timings["altenv"]["median_s"]
    return {name: t["median_s"] / ours for name, t in timings.items() if name != "altenv"}


def timing_table(timings: dict[str, dict[str, Any]]) -> str:
    """A run's timings as printed: median, [min .. max] and spread of altenv and each
    baseline, and altenv's speedup; a timing too spread to trust is flagged and a speedup
    built on it marked unreliable."""
    speedup = speedups(timings)
    lines = []
    for name, t in timings.items():
        unsure = t["noisy"] or timings["altenv"]["noisy"]
        lines.append(f"  {name:14s} median {t['median_s'] * 1e3:9.4f} ms  "
                     f"[{t['min_s'] * 1e3:.4f} .. {t['max_s'] * 1e3:.4f}]  "
                     f"spread {t['spread']:.2f}{' (too spread)' if t['noisy'] else ''}"
                     + ("" if name == "altenv" else f"  altenv speedup {speedup[name]:.2f}x"
                        + (" (unreliable)" if unsure else "")))
    if any(t["noisy"] for t in timings.values()):
        lines.append(f"  (spread: interquartile range / median of the rounds; above "
                     f"{NOISY_SPREAD} a timing is too spread to trust and speedups built on it "
                     "are unreliable: time again on a quieter host)")
    return "\n".join(lines) + "\n"
