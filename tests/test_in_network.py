"""A network task's layout chosen inside the network: what its calls run there (conversions,
read-through variants), its contenders, and the choice among them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from synthetic import SyntheticMeasurer
from test_network import _conv_chain
from tvm_ffi import structural_equal

from altenv.graph.in_network import Choice, Contender, choose_layouts, contenders
from altenv.graph.network import call_options
from altenv.graph.plan import plan_network, tensor_name
from altenv.measure.chains import kernel_module
from altenv.records import RecordDB
from altenv.tuning import OpTask, TuningSession, freeze

TILED = [{"ht": 5, "wt": 2, "ot": 4, "it": 2, "it_w": 4, "ot_w": 2},
         {"ht": 2, "wt": 10, "ot": 8, "it": 8, "it_w": 8, "ot_w": 8},
         {"ht": 10, "wt": 5, "ot": 2, "it": 4, "it_w": 2, "ot_w": 4}]


def _schedule(plan, index: int, seed: int):
    lowering = plan.lowerings[index]
    task = plan.graph.calls[index].task
    space = OpTask(lowering.spec, "llvm", lowering.epilogue).space(freeze(plan.factors[task]))
    return space.decode(space.sample(1, seed=seed)[0])


def _run(func, args: list[np.ndarray]) -> np.ndarray:
    """Run a PrimFunc whose last parameter is its output on ``args``; that output."""
    lib = tvm.compile(kernel_module(func), target="llvm")
    dev = tvm.cpu()
    tensors = [tvm.runtime.tensor(a, dev) for a in args]
    out = tvm.runtime.tensor(np.zeros([int(d) for d in func.params[-1].shape], "float32"), dev)
    lib["main"](*tensors, out)
    return out.numpy()


def test_call_options_convert_or_read_through_and_agree():
    """conv1 of a chain of three, on a tiled layout its producer does not store: converting
    then calling it, calling its variant that reads the stored layout through guards, and
    calling each variant with the conversion staged inside at a loop of its schedule, give
    the same (torch's) numbers; on the untiled layouts its 1x1 input is read as stored, no
    conversion."""
    graph, ws = _conv_chain()
    calls = graph.complex_calls()
    plan = plan_network(graph, {c.task: f for c, f in zip(calls, TILED)})
    schedules = {c.task: _schedule(plan, c.index, c.index) for c in calls}
    options = call_options(plan, schedules, 1, "llvm")
    # conversion + call; the guarded variant; staged variants (at least two loops differ)
    assert [len(chain) for chain in options][:2] == [2, 1] and len(options) >= 4
    assert all(len(chain) == 1 for chain in options[1:])

    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.uniform(-1, 1, (1, 8, 10, 10)).astype("float32"))
    y0 = torch.conv2d(x, torch.from_numpy(ws["w1"]), padding=1)
    y1 = torch.conv2d(y0, torch.from_numpy(ws["w2"])).numpy()
    stored = plan.propagation.layout_of(tensor_name(0), plan.dataflow.shapes).apply(y0.numpy())
    layouts = plan.layouts[calls[1].task]
    weight = layouts["weight"].apply(ws["w2"])
    expected = layouts["out"].apply(y1)
    (convert, kernel), *variants = options
    converted = _run(convert, [stored])
    np.testing.assert_allclose(_run(kernel, [converted, weight]), expected, rtol=1e-4, atol=1e-4)
    for (variant,) in variants:
        np.testing.assert_allclose(_run(variant, [stored, weight]), expected, rtol=1e-4,
                                   atol=1e-4)

    untiled = plan_network(graph)
    assert [len(chain) for chain in call_options(untiled, {}, 1, "llvm")] == [1]


def _contenders(graph, tiled: bool):
    """conv1's contenders: its tiled layout (converted into) first, then the untiled one
    (its producer, untiled too, stores what it reads)."""
    calls = graph.complex_calls()
    task = calls[1].task
    result = []
    for factors in ([TILED[1]] if tiled else []) + [None]:
        plan = plan_network(graph, {task: factors} if factors else {})
        result.append(Contender(None, dict(plan.factors[task]), _schedule(plan, 1, 1), 1e-5))
    return task, result


def test_the_contender_fastest_in_the_network_is_kept():
    """Each contender's calls are timed with their conversions (or read through); the
    fastest in the network wins even when it comes second alone, and a resumed choice with
    the same contenders is not timed again."""
    graph, _ = _conv_chain()
    task, cands = _contenders(graph, tiled=True)
    plain = plan_network(graph, {task: cands[1].factors})
    (direct,) = call_options(plain, {task: cands[1].schedule}, 1, "llvm")
    timed: list[list[int]] = []

    class Stats:
        def __init__(self, median: float):
            self.median = median

    def fake_timer(chains, rounds, seed):
        timed.append(sorted(len(chain) for chain in chains.values()))
        return {key: Stats(1e-6 if len(chain) == 1 and structural_equal(chain[0], direct[0])
                           else 3e-6) for key, chain in chains.items()}

    seen: dict[str, Choice] = {}
    choices = choose_layouts(graph, {}, {}, {task: cands}, "llvm", on_choice=seen.__setitem__,
                             timer=fake_timer)
    # the direct call, the guarded and staged variants, convert + call: timed together once
    assert len(timed) == 1 and len(timed[0]) >= 4 and timed[0][-1] == 2
    assert timed[0].count(2) == 1
    assert choices == seen == {task: Choice((cands[0].factors, cands[1].factors),
                                            (3e-6, 1e-6), 1)}
    again = choose_layouts(graph, {}, {}, {task: cands}, "llvm", known=choices,
                           timer=fake_timer)
    assert again == choices and len(timed) == 1
    assert Choice.from_json(choices[task].to_json()) == choices[task]


def test_a_best_layout_read_as_stored_is_kept_without_timing():
    """When the best layout needs no conversion there is nothing to weigh: no timing, no
    choice recorded."""
    graph, _ = _conv_chain()
    task, (untiled,) = _contenders(graph, tiled=False)
    assert choose_layouts(graph, {}, {}, {task: [untiled, untiled]}, "llvm",
                          timer=lambda *a: pytest.fail("timed")) == {}


def test_choosing_times_real_kernels():
    """Timed for real, each contender gets its seconds per network run and the fastest is
    kept."""
    graph, _ = _conv_chain()
    task, cands = _contenders(graph, tiled=True)
    choice = choose_layouts(graph, {}, {}, {task: cands}, "llvm", rounds=2)[task]
    assert len(choice.seconds) == 2 and all(0 < s < 1 for s in choice.seconds)
    assert choice.chosen == int(np.argmin(choice.seconds))


def test_contenders_are_the_best_of_the_fastest_layouts(tmp_path):
    """The session's best first, then each other layout's fastest candidate within the
    slack, fastest first, one per layout."""
    task = OpTask("c2d:N=1,I=8,O=8,H=8,W=8,KH=3,KW=3,stride=1,pad=1")
    rng = np.random.default_rng(0)
    with RecordDB(tmp_path / "records.jsonl") as db:
        session = TuningSession(task, SyntheticMeasurer(), db, check=False)
        layouts = list(dict.fromkeys(task.random_factors(rng) for _ in range(8)))
        for factors in layouts:
            session.measure([_candidate(task, factors, s) for s in range(3)])
        best, _ = session.best
        found = contenders(session, 4, slack=100.0)
        assert found[0].candidate == best and len(found) == min(4, len(layouts))
        assert len({freeze(c.factors) for c in found}) == len(found)
        rest = [c.latency for c in found[1:]]
        assert rest == sorted(rest)
        for c in found:
            assert c.latency == min(lat for cand, lat in session.measured_items()
                                    if cand.factors == freeze(c.factors))
        assert [c.candidate for c in contenders(session, 4, slack=1.0)][:1] == [best]
        assert len(contenders(session, 1, slack=100.0)) == 1


def _candidate(task: OpTask, factors, seed: int):
    from altenv.tuning import Candidate

    return Candidate(factors, task.space(factors).sample(1, seed=seed)[0])
