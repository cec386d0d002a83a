"""The task scheduler of a model run's reserved trials (Ansor's gradient, §6)."""

from __future__ import annotations

import math

from altenv.ops.workload import parse_workload
from altenv.tuning.scheduler import (
    ALPHA,
    TaskProgress,
    gradient,
    handed_out,
    next_task,
    similarity_group,
)


def _task(history, calls=1, work=1e6, group="c2d:KH=1,KW=1"):
    return TaskProgress(calls, work, group, history)


def test_the_task_far_below_its_peers_throughput_goes_first():
    # same work, same latency history length: b runs at a third of a's throughput
    tasks = {"a": _task([1e-4] * 16), "b": _task([3e-4] * 16)}
    assert next_task(tasks, window=8) == "b"
    # a's throughput sets the bar; b is more than BETA = 2x off it, a is not
    assert gradient(tasks["b"], 1e6 / 1e-4, 8) < gradient(tasks["a"], 1e6 / 1e-4, 8) < 0


def test_calls_weigh_and_a_task_that_still_improves_gains():
    flat = _task([2e-4] * 16)
    assert next_task({"once": flat, "thrice": _task([2e-4] * 16, calls=3)}, 8) == "thrice"
    falling = _task([4e-4] * 8 + [2e-4] * 8)
    peer = 1e6 / 2e-4
    assert gradient(falling, peer, 8) < gradient(flat, peer, 8)


def test_a_task_with_nothing_running_comes_first_and_groups_compare_apart():
    assert next_task({"ok": _task([1e-3] * 8), "none": _task([math.inf] * 8)}, 8) == "none"
    assert next_task({}, 8) is None
    # d is 3x off c's throughput, e 2.5x; d is depthwise, so c only sets e's bar
    tasks = {"c": _task([1e-4] * 16), "d": _task([3e-4] * 16, group="dep:KH=3,KW=3"),
             "e": _task([2.5e-4] * 16)}
    assert next_task(tasks, 8) == "e"
    assert gradient(tasks["d"], 1e6 / 3e-4, 8) == -(1 - ALPHA) * 3e-4 / 16
    merged = {name: _task(t.history) for name, t in tasks.items()}
    assert next_task(merged, 8) == "d"


def test_trials_past_the_share_count_as_handed_out():
    assert handed_out({"a": 40, "b": 30, "c": 8}, {"a": 32, "b": 32, "c": 8}) == {"a": 8}


def test_similarity_groups_drop_shapes_but_keep_the_kernel():
    def group(spec):
        return similarity_group(parse_workload(spec))

    one = group("c2d:N=1,I=32,O=16,H=112,W=112,KH=1,KW=1,stride=1,pad=0")
    assert one == group("c2d:N=1,I=96,O=576,H=14,W=14,KH=1,KW=1")
    assert one != group("c2d:N=1,I=3,O=32,H=224,W=224,KH=3,KW=3,stride=2,pad=1")
    assert one != group("dep:N=1,C=32,H=112,W=112,KH=1,KW=1")
