"""Replay of a run's recorded best: each tuned operator's layout factors and loop decisions
decoded back into its schedule.

Export, ``altenv bench`` and a resumed bench cell rebuild tuned programs from ``best.json``
(or a cell's summary) this way instead of tuning again; a best that this version's loop
spaces no longer decode is a :class:`~altenv.space.StaleRecordError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tvm.s_tir import Schedule

from ..ops.workload import Workload, parse_workload
from ..space import StaleRecordError
from ..tuning import OpTask, freeze
from ..tuning.task import Factors


def replay_best(workload: Workload, epilogue: Sequence[str], target: Any,
                entry: Mapping[str, Any], mapping: str = "none"
                ) -> tuple[OpTask, Factors, Schedule]:
    """The task, template factors and schedule of a recorded best candidate of ``workload``
    (``entry``: its ``factors`` and loop ``decisions``)."""
    task = OpTask(workload, target, epilogue, mapping=mapping)
    factors = freeze(entry["factors"])
    space = task.space(factors)
    try:
        point = space.from_vector(entry["decisions"])
    except StaleRecordError as err:
        raise StaleRecordError(f"{workload}: the recorded best (layout {dict(factors)}): {err}; "
                               "tune it again with this version") from err
    schedule = space.decode(point)
    if schedule is None:
        raise StaleRecordError(f"{workload}: the recorded best (layout {dict(factors)}) no longer "
                               "decodes to a valid schedule; tune it again with this version")
    return task, factors, schedule


def best_schedules(target: Any, best: Mapping[str, Any]
                   ) -> tuple[dict[str, dict[str, int]], dict[str, Schedule],
                              dict[str, int] | list[int] | str]:
    """The best template factors and schedules of each task of a finished network run and
    the calls that read their input as stored, and how (from its ``best.json``; a list of
    calls that read guarded from a run recorded before staged variants; ``"measure"``, to
    choose them again, for a run recorded before the build could read through)."""
    factors, schedules = {}, {}
    for name, entry in best["tasks"].items():
        workload = parse_workload(entry["spec"])  # as best.json stores it
        _, f, schedule = replay_best(workload, entry["epilogue"], target, entry)
        factors[name], schedules[name] = dict(f), schedule
    return factors, schedules, best.get("read_through", "measure")
