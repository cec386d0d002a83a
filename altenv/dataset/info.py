"""``altenv dataset info``: a dataset's card and what each workload holds, as text."""

from __future__ import annotations

import numpy as np

from .store import Dataset


def format_info(path: str) -> str:
    """The card's headline (host, where it was timed when not there, target, commit, counts,
    hours, the reference kernel's range) and one line per workload: its URI, spec, layouts,
    programs, failures, the spread from its slowest to its fastest program, the median
    spread of a program's own timings, how far the reference kernel drifted (max / min)
    while it was measured, and how much faster the bests of its search are than the best
    of its sampled programs ("-": not searched)."""
    data = Dataset.open(path)
    card = data.card
    host = card.get("host", {})
    counts = card.get("counts", {})
    timed = card.get("timed_on", "host")
    where = "" if timed == "host" else f" (timed on {timed})"
    lines = [f"dataset {data.name} ({data.path})",
             f"  host {host.get('cpu', '?')}{where}, target {card.get('target', '?')}, "
             f"commit {host.get('commit', '?')}",
             f"  {counts.get('workloads', 0)} of {len(card.get('workloads', []))} workloads "
             f"collected, {counts.get('programs', 0)} programs ({counts.get('failed', 0)} "
             f"failed), {card.get('collection_hours', 0)} h of collection"]
    reference = data.reference()
    base = float(np.median(reference.column("latency").to_numpy())) if reference else np.nan
    if reference:
        ref = reference.column("latency").to_numpy()
        lines.append(f"  reference kernel {card.get('reference_kernel', '?')}: median "
                     f"{base * 1e3:.4f} ms over {len(ref)} timings, "
                     f"{ref.min() / base:.2f}x to {ref.max() / base:.2f}x of it")
    lines.append("  workload (URI)            layouts programs failed  best ms  slowest/"
                 "fastest  timing spread  reference drift  search gain")
    for name in data.workloads():
        w = data.load(name)
        ok = w.latency[np.isfinite(w.latency)]
        spread = f"{ok.max() / ok.min():.1f}x" if ok.size else "-"
        noise = np.median([(t.max() - t.min()) / np.median(t) for t in w.latencies
                           if len(t) > 1] or [np.nan])
        refs = w.table.column("reference").to_numpy()
        drift = (np.nanmax(refs) / np.nanmin(refs)) if np.isfinite(refs).any() else np.nan
        sampled = w.latency[np.isin(w.origin, ("sample", "search"))]
        gain = (f"{np.min(sampled) / w.best:.2f}x" if "search" in w.meta and sampled.size
                else "-")
        lines.append(f"  altenv://{data.name}/{name:9s} {len(w.layouts):5d} {len(w):8d} "
                     f"{len(w) - ok.size:6d} {w.best * 1e3:8.4f} {spread:>16s} "
                     f"{noise:13.2f} {drift:15.2f}x {gain:>12s}   {w.spec}")
    return "\n".join(lines) + "\n"
