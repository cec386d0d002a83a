"""``altenv dataset info``: a dataset's card and what each workload holds, as text."""

from __future__ import annotations

import numpy as np

from .store import Dataset


def format_info(path: str) -> str:
    """The card's headline (host, target, commit, counts, hours) and one line per
    workload: its URI, spec, layouts, programs, failures and the spread from its slowest
    to its fastest program."""
    data = Dataset.open(path)
    card = data.card
    host = card.get("host", {})
    counts = card.get("counts", {})
    lines = [f"dataset {data.name} ({data.path})",
             f"  host {host.get('cpu', '?')}, target {card.get('target', '?')}, "
             f"commit {host.get('commit', '?')}",
             f"  {counts.get('workloads', 0)} of {len(card.get('workloads', []))} workloads "
             f"collected, {counts.get('programs', 0)} programs ({counts.get('failed', 0)} "
             f"failed), {card.get('collection_hours', 0)} h of collection"]
    for name in data.workloads():
        w = data.load(name)
        ok = w.latency[np.isfinite(w.latency)]
        spread = f"{ok.max() / ok.min():.1f}x" if ok.size else "-"
        lines.append(f"  altenv://{data.name}/{name:9s} {w.spec:55s} {len(w.layouts):3d} "
                     f"layouts {len(w):4d} programs {len(w) - ok.size:3d} failed, best "
                     f"{w.best * 1e3:.4f} ms, slowest/fastest {spread}")
    return "\n".join(lines) + "\n"
