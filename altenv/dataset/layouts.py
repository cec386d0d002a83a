"""Which layouts of a workload a dataset measures: all its template allows, up to a cap.

A dataset that replays layout choices must hold the layouts a search would visit, and it
must always hold the framework layout (untiled channels: what MetaSchedule tunes), so
that a tuner's ratio over MetaSchedule can be replayed too. Where the template allows
more layouts than the cap, the rest are drawn stratified: each knob cycles through its
choices in a shuffled order, so every tile size of every knob appears about equally
often (a Latin-hypercube design over the knobs), not only the combinations a uniform
draw favours.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..ops.templates import LayoutTemplate
from ..tuning.task import Factors, freeze


def layout_plan(template: LayoutTemplate, cap: int, rng: np.random.Generator,
                lanes: int) -> list[Factors]:
    """Up to ``cap`` distinct valid layouts of ``template``: the framework layout first,
    the vendor-style blocked one (``lanes``-wide channel blocks) second, then every other
    layout when they fit under the cap, else a stratified draw of them."""
    fixed = [freeze(template.default_factors()), freeze(template.blocked_factors(lanes))]
    plan: list[Factors] = list(dict.fromkeys(fixed))[:cap]
    knobs = template.knobs
    choices = [template.choices(k) for k in knobs]
    total = math.prod(len(c) for c in choices)

    def add(values: tuple[int, ...]) -> None:
        factors = dict(zip((k.name for k in knobs), values))
        try:
            template.check(factors)
        except ValueError:
            return
        frozen = freeze(factors)
        if frozen not in plan:
            plan.append(frozen)

    if total <= 4 * cap:
        combos = list(itertools.product(*choices))
        for i in rng.permutation(len(combos)):
            if len(plan) >= cap:
                break
            add(combos[i])
        return plan
    orders = [rng.permutation(len(c)) for c in choices]
    for i in range(50 * cap):
        if len(plan) >= cap:
            break
        cycle = i // max(1, min(len(c) for c in choices))
        add(tuple(int(c[o[(i + cycle * (j + 1)) % len(c)]])
                  for j, (c, o) in enumerate(zip(choices, orders))))
    return plan
