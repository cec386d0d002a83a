"""Short stable names of a dataset's workloads (``c2d-003``).

A name is the operator kind and the workload's index among those of its kind, so that
``altenv://<dataset>/c2d-003`` names one workload for as long as the config does not
change, and a config that adds workloads at its end keeps the old names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..ops.workload import Workload, parse_workload


def name_workloads(specs: Iterable[str | Workload]) -> list[tuple[str, Workload]]:
    """``(name, workload)`` of each distinct workload (spec strings parsed), in order."""
    counts: Counter[str] = Counter()
    out = []
    for workload in dict.fromkeys(parse_workload(s) for s in specs):
        kind = workload.kind
        out.append((f"{kind}-{counts[kind]:03d}", workload))
        counts[kind] += 1
    return out
