"""Which task of a model run gets the next batch of its reserved trials.

A model run first gives each task a share of its trials in proportion to a roofline
estimate of the task's latency. Searches that short are at the mercy of luck: two runs
of the same code found 0.29 and 0.54 ms for MobileNet-V2's first convolution, 0.11 and
0.31 ms for its 32 -> 16 channel 1x1 convolution. So a share of the trials is held back
and handed out afterwards a batch at a time, to the task whose next trials promise the
largest drop of the network's latency: Ansor's gradient task scheduler (Zheng et al.,
OSDI'20, §6), with its constants (``ALPHA``, ``BETA``). A task's gradient mixes how much
its best latency fell over its last ``window`` trials with an optimistic guess of what it
could reach: the throughput of the fastest similar task (same operator kind, kernel
window and stride), counted in the roofline work that sized the shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..ops.workload import Workload

ALPHA = 0.2
"""Weight of the measured slope against the optimistic guess (Ansor's ``alpha``)."""
BETA = 2.0
"""How far (x) from the fastest similar task's throughput a task may be and still count as
tuned (Ansor's ``beta``)."""


@dataclass(frozen=True)
class TaskProgress:
    """What the scheduler knows of one task."""

    calls: int
    """Calls of the task in the network (its latency's weight)."""
    work: float
    """Roofline work of one call (``max(FLOPs, ridge x bytes)``, the budget's unit)."""
    group: str
    """Tasks of one group are similar (their throughputs are comparable)."""
    history: Sequence[float]
    """Best latency (s) after each of its trials; ``inf`` until one succeeded."""


def gradient(task: TaskProgress, best_throughput: float, window: int) -> float:
    """d(network latency)/d(trials) of ``task`` (negative: more trials help; s/trial)."""
    trials = len(task.history)
    now = task.history[-1] if trials else math.inf
    if not math.isfinite(now):
        return -math.inf  # nothing runs yet: first in line
    before = task.history[-window - 1] if trials > window else now
    slope = (now - before) / window if math.isfinite(before) else 0.0
    optimistic = min(-now / trials, BETA * task.work / best_throughput - now)
    return task.calls * (ALPHA * slope + (1 - ALPHA) * optimistic)


def next_task(tasks: Mapping[str, TaskProgress], window: int) -> str | None:
    """The task with the most negative :func:`gradient` (ties: the first), ``None`` when
    no task is left."""
    if not tasks:
        return None
    best: dict[str, float] = {}
    for t in tasks.values():
        now = t.history[-1] if t.history else math.inf
        if math.isfinite(now) and now > 0:
            best[t.group] = max(best.get(t.group, 0.0), t.work / now)
    grads = {name: gradient(t, best.get(t.group, math.inf), window)
             for name, t in tasks.items()}
    return min(grads, key=grads.get)


def handed_out(trials: Mapping[str, int], shares: Mapping[str, int]) -> dict[str, int]:
    """The reserved trials each task got (a resumed run included): its trials past its
    share, for the tasks that have any."""
    return {t: trials[t] - shares[t] for t in shares if trials[t] > shares[t]}


def similarity_group(workload: Workload) -> str:
    """Tasks whose throughputs the scheduler compares: the operator kind with its kernel
    window, stride, dilation and groups (shapes aside)."""
    kept = [f"{k}={v}" for k, v in workload.params.items()
            if k.startswith("K") or k in ("stride", "dilation", "groups")]
    return f"{workload.kind}:{','.join(kept)}"
