"""Per-kernel profiles of benchmarked networks: ``profile.csv``, a printed summary, a plot.

The rows come from :func:`altenv.graph.kernels.profile_kernels`: each program's kernels
timed alone, warm and cold (weights flushed from the caches), all of them interleaved, and
each timed inside its network as ``main`` calls it. The summary puts the programs side by
side by what their kernels compute (complex op kinds, layout conversions, reductions,
elementwise and injective tasks), next to the network latency the entry's re-timing
measured and the kernels' sums inside the network and alone cold: what they lose there
(cold caches) is the difference between the warm and in-network sums, which the cold sum
approaches; what is left up to the network latency is what the VM does between kernels.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

from altenv.bench.report import write_csv
from altenv.graph.kernels import KernelTime

#: Kernels listed per program under the summary.
TOP_KERNELS = 8


def write_profile(entry: str, profiles: Mapping[str, list[KernelTime]],
                  latency: Mapping[str, float], directory: Path) -> str:
    """Write ``directory/profile.csv`` and ``profile.png`` for ``profiles`` (program label ->
    kernels) of ``entry``; ``latency`` holds the re-timed network seconds per label where
    known. Returns the summary as text."""
    rows = [{"workload": entry, "program": label, "kernel": k.name, "kind": k.kind,
             "calls": k.calls, "us_per_call": k.seconds * 1e6, "total_us": k.total * 1e6,
             "spread": k.spread, "cold_us_per_call": k.cold * 1e6,
             "cold_total_us": k.cold_total * 1e6, "in_network_us_per_call": k.in_network * 1e6,
             "in_network_total_us": k.network_total * 1e6}
            for label, kernels in profiles.items() for k in kernels]
    write_csv(rows, directory / "profile.csv")
    by_kind = {label: _by_kind(kernels) for label, kernels in profiles.items()}
    _plot(entry, by_kind, directory / "profile.png")
    return _table(entry, profiles, by_kind, latency)


def _by_kind(kernels: list[KernelTime]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for k in kernels:
        totals[k.kind] += k.total
    return dict(totals)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if math.isfinite(seconds) else "-"


def _kinds(by_kind: Mapping[str, Mapping[str, float]]) -> list[str]:
    """Every kind, the largest overall first."""
    overall: dict[str, float] = defaultdict(float)
    for totals in by_kind.values():
        for kind, seconds in totals.items():
            overall[kind] += seconds
    return sorted(overall, key=lambda kind: -overall[kind])


def _table(entry: str, profiles: Mapping[str, list[KernelTime]],
           by_kind: Mapping[str, Mapping[str, float]], latency: Mapping[str, float]) -> str:
    kinds = _kinds(by_kind)
    head = ["program", "network ms", "kernels in network ms", "kernels alone cold ms",
            "kernels alone ms", *(f"{k} ms" for k in kinds)]
    lines = [f"{entry}: kernels timed alone, interleaved (ms per network run; by kind: "
             "alone)", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, totals in by_kind.items():
        cells = [label, _ms(latency.get(label, math.nan)),
                 _ms(sum(k.network_total for k in profiles[label])),
                 _ms(sum(k.cold_total for k in profiles[label])),
                 _ms(sum(totals.values())), *(_ms(totals.get(k, 0.0)) for k in kinds)]
        lines.append("| " + " | ".join(cells) + " |")
    for label, kernels in profiles.items():
        lines.append(f"{label}: largest kernels (alone; alone cold; inside the network)")
        for k in kernels[:TOP_KERNELS]:
            lines.append(f"  {k.total * 1e3:8.3f} ms  {k.calls:3d} x {k.seconds * 1e6:9.1f} us"
                         f"; {_ms(k.cold_total)} ms; {_ms(k.network_total)} ms  {k.kind:<10}"
                         f" {k.name}")
    return "\n".join(lines) + "\n"


def _plot(entry: str, by_kind: Mapping[str, Mapping[str, float]], path: Path) -> None:
    """One stacked bar per program, a segment per kind."""
    import matplotlib  # 0.35 s, for the plots only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(by_kind)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.6 * len(labels)))
    left = [0.0] * len(labels)
    for kind in _kinds(by_kind):
        widths = [by_kind[label].get(kind, 0.0) * 1e3 for label in labels]
        ax.barh(labels, widths, left=left, label=kind)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("ms per network run (kernels timed alone)")
    ax.set_title(f"{entry}: where the time goes")
    ax.invert_yaxis()
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
