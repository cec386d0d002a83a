"""Short stable names of a dataset's workloads (``c2d-003``).

A name is the operator kind and the workload's index among those of its kind, so that
``altenv://<dataset>/c2d-003`` names one workload for as long as the config does not
change, and a config that adds workloads at its end keeps the old names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from ..ops import parse_workload


def name_workloads(specs: Iterable[str]) -> list[tuple[str, str]]:
    """``(name, canonical spec)`` of each distinct spec, in order."""
    counts: Counter[str] = Counter()
    out = []
    for spec in dict.fromkeys(str(parse_workload(s)) for s in specs):
        kind = parse_workload(spec).kind
        out.append((f"{kind}-{counts[kind]:03d}", spec))
        counts[kind] += 1
    return out
