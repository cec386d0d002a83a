"""Each network task's layout chosen where it runs: its fastest layouts, tuned alone,
re-timed with what getting their operands costs inside the network.

A task is tuned alone, on inputs already stored in the layouts its template reads. In the
network its data comes from a producer that stores it in its own layout (a convolution
writes its template's output layout; ALT inserts a conversion there, Alg. 1 line 3), so a
layout that unfolds or re-tiles its input pays for a conversion, or a slower read of the
stored layout, that its tuning never saw. In MobileNet-V2 a
stride-2 depthwise convolution tuned into a layout that unfolds its width into windows
(1.5x the data) ran in 305 us alone and 675 us inside the network, where MetaSchedule's
kernel took 272 us.

:func:`choose_layouts` decides the tasks in graph order, producers first, so the layouts
a task's operands are stored in are final when it is decided. A task whose best layout
reads its operands as they are stored keeps it. Otherwise the best candidate of each of its
fastest layouts (:func:`contenders`) is timed, interleaved, with what its calls run in the
network (:func:`altenv.graph.network.call_options`: the conversions, then the call; or
the call reading its data as stored, whichever is faster), summed over its calls, and the
fastest there is kept.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tvm
import tvm_ffi

from altenv.graph.network import call_options
from altenv.graph.plan import plan_network
from altenv.graph.scheduler import Scheduled
from altenv.graph.tasks import TaskGraph
from altenv.measure.chains import ChainTimer, local_timer
from altenv.target import make_target


@dataclass(frozen=True)
class Contender:
    """A layout of a task, as its best measured candidate: ``latency`` seconds alone."""

    candidate: Any
    factors: Mapping[str, int]
    schedule: Scheduled
    latency: float


@dataclass(frozen=True)
class Choice:
    """How a task's layout was chosen: its contenders' factors, their seconds per network
    run (all its calls, with their conversions) and the index of the one kept."""

    factors: tuple[dict[str, int], ...]
    seconds: tuple[float, ...]
    chosen: int

    def to_json(self) -> dict[str, Any]:
        return {"factors": list(self.factors), "seconds": list(self.seconds),
                "chosen": self.chosen}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Choice:
        return cls(tuple(dict(f) for f in data["factors"]), tuple(data["seconds"]),
                   int(data["chosen"]))


def contenders(session: Any, count: int, slack: float) -> list[Contender]:
    """The layouts a task of a network run may keep: its session's best candidate first,
    then the best candidate of each other layout within ``slack`` times the fastest
    measured latency, fastest first, ``count`` in all."""
    best, _ = session.best
    if best is None:
        return []
    by_layout: dict[Any, tuple[Any, float]] = {}
    for cand, latency in session.measured_items():
        if math.isfinite(latency) and latency < by_layout.get(cand.factors, (None, math.inf))[1]:
            by_layout[cand.factors] = (cand, latency)
    fastest = min(lat for _, lat in by_layout.values())
    others = sorted((pair for factors, pair in by_layout.items()
                     if factors != best.factors and pair[1] <= slack * fastest),
                    key=lambda pair: pair[1])
    picked = [(best, by_layout[best.factors][1])] + others
    result = []
    for cand, latency in picked:
        schedule = session.schedule(cand)
        if schedule is not None:
            result.append(Contender(cand, dict(cand.factors), schedule, latency))
        if len(result) == count:
            break
    return result


def choose_layouts(graph: TaskGraph, factors: Mapping[str, Mapping[str, int]],
                   schedules: Mapping[str, Scheduled],
                   options: Mapping[str, Sequence[Contender]],
                   target: str | dict | tvm.target.Target | None = None,
                   known: Mapping[str, Choice] | None = None,
                   on_choice: Callable[[str, Choice], None] | None = None,
                   rounds: int = 7, seed: int = 0,
                   timer: ChainTimer | None = None,
                   fast_math: Collection[str] = ()) -> dict[str, Choice]:
    """Choose, for each task of ``options`` with more than one contender (in graph order),
    the contender fastest in the network, the tasks before it on their chosen layouts
    (``factors``, ``schedules``: every task's tuned best; the others keep theirs). A task in
    ``known`` with the same contenders keeps its recorded choice (a resumed run);
    ``on_choice`` is called with every new one. The chains are timed by ``timer`` (the
    measuring device's, :meth:`altenv.measure.Measurer.chain_timer`; this host's by
    default), the network planned with ``fast_math`` as the run plans it
    (:func:`~altenv.graph.plan.plan_network`). Returns the choices made by timing."""
    tgt = make_target(target)
    timer = timer or local_timer(tgt)
    factors, schedules = dict(factors), dict(schedules)
    choices: dict[str, Choice] = {}
    for task, cands in options.items():
        if len(cands) < 2:
            continue
        choice = (known or {}).get(task)
        if choice is None or list(choice.factors) != [dict(c.factors) for c in cands]:
            choice = _time(graph, factors, schedules, task, cands, tgt, timer, rounds, seed,
                           fast_math)
            if choice is None:
                continue
            if on_choice is not None:
                on_choice(task, choice)
        choices[task] = choice
        factors[task] = dict(cands[choice.chosen].factors)
        schedules[task] = cands[choice.chosen].schedule
    return choices


def _time(graph: TaskGraph, factors: dict[str, Mapping[str, int]],
          schedules: dict[str, Scheduled], task: str, cands: Sequence[Contender],
          target: tvm.target.Target, timer: ChainTimer, rounds: int, seed: int,
          fast_math: Collection[str]) -> Choice | None:
    """Time every contender of ``task`` in the network; ``None`` when the first reads its
    operands as they are stored (nothing to weigh against its lead)."""
    ways: list[list[list[str]]] = []  # contender -> call -> its options' chain keys
    chains: dict[str, list[Any]] = {}
    for cand in cands:
        plan = plan_network(graph, {**factors, task: cand.factors}, fast_math)
        scheduled = {**schedules, task: cand.schedule}
        per_call = []
        for index in sorted(i for i in plan.lowerings if graph.calls[i].task == task):
            keys = []
            for chain in call_options(plan, scheduled, index, target):
                key = str(tuple(tvm_ffi.structural_hash(f) for f in chain))
                chains.setdefault(key, chain)
                keys.append(key)
            per_call.append(keys)
        ways.append(per_call)
    if all(len(keys) == 1 and len(chains[keys[0]]) == 1 for keys in ways[0]):
        return None
    stats = timer(chains, rounds, seed)
    seconds = tuple(sum(min(stats[key].median for key in keys) for keys in per_call)
                    for per_call in ways)
    chosen = min(range(len(cands)), key=seconds.__getitem__)
    return Choice(tuple(dict(c.factors) for c in cands), seconds, chosen)
