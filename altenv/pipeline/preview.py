"""``altenv tasks``: what a model run would tune, before any tuning.

A user bringing a network wants to know up front which of its complex calls the layout
search covers, which stay on a default schedule and why (the planner's
:class:`~altenv.graph.lowering.NotMappable` reason), and how much of the network's work
that is. This reads the same plan a run makes (:func:`altenv.graph.plan.plan_network`)
and measures nothing.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from ..graph import ImportedModel, extract_tasks
from ..graph.plan import plan_network
from ..ops import operator_for, parse_workload
from ..ops.epilogue import DEFAULT_FAST_MATH


def _flops(spec: str) -> int | None:
    """FLOPs of the spec of a call left untuned, or ``None`` when :mod:`altenv.ops` cannot
    parse it."""
    try:
        return operator_for(parse_workload(spec)).flops()
    except ValueError:
        return None


def preview(model: ImportedModel) -> dict[str, Any]:
    """Every complex call of ``model``: its spec, epilogue, whether it is tuned with layouts
    (else the reason) and FLOPs; and the share of the complex calls' FLOPs that is tuned
    (calls whose FLOPs are unknown count in neither)."""
    graph = extract_tasks(model)
    planner = logging.getLogger(plan_network.__module__)
    level = planner.level
    planner.setLevel(logging.ERROR)  # its fallback warnings are the report's reasons
    try:
        plan = plan_network(graph, fast_math=DEFAULT_FAST_MATH)
    finally:
        planner.setLevel(level)
    calls = []
    for call in graph.complex_calls():
        lowering = plan.lowerings.get(call.index)
        spec = lowering.spec if lowering else call.op.spec()  # type: ignore[union-attr]
        calls.append({
            "call": call.index, "task": call.task, "spec": spec,
            "epilogue": list(lowering.epilogue) if lowering else None,
            "tuned": lowering is not None,
            "reason": None if lowering else plan.fallbacks.get(call.index, "not mapped"),
            "flops": operator_for(lowering.workload).flops() if lowering else _flops(spec)})
    known = [c for c in calls if c["flops"] is not None]
    total = sum(c["flops"] for c in known)
    tuned = sum(c["flops"] for c in known if c["tuned"])
    return {"model": model.name, "calls": calls, "tuned_calls": sum(c["tuned"] for c in calls),
            "flops": total, "tuned_flops": tuned,
            "tuned_flops_share": tuned / total if total else 0.0}


def format_preview(report: dict[str, Any], as_json: bool = False) -> str:
    """The report as JSON or as a table, one line per call, then the totals."""
    if as_json:
        return json.dumps(report, indent=2) + "\n"
    lines = [f"{'call':>4}  {'tuned':5}  {'MFLOP':>9}  workload and epilogue / why not tuned"]
    for c in report["calls"]:
        flops = "?" if c["flops"] is None else f"{c['flops'] / 1e6:.2f}"
        what = c["spec"] + ("|" + "+".join(c["epilogue"]) if c["epilogue"] else "")
        if not c["tuned"]:
            what += f"  ({c['reason']})"
        lines.append(f"{c['call']:>4}  {'yes' if c['tuned'] else 'no':5}  {flops:>9}  {what}")
    lines.append(f"{report['model']}: {report['tuned_calls']} of {len(report['calls'])} "
                 f"complex calls tuned with layouts, {report['tuned_flops_share']:.1%} of "
                 f"their {report['flops'] / 1e6:.2f} MFLOP")
    return "\n".join(lines) + "\n"
