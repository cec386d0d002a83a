"""The kernels a network build does not search layouts for: MetaSchedule tuning them
(``budget.others``), TVM's fast math in regenerated elementwise tasks, and the per-kernel
profile of a built network."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tvm
from test_network import _hand_factors, _hand_graph
from tvm import relax, te, tirx, topi

from altenv.baselines import network_baseline
from altenv.config import RunConfig
from altenv.graph import extract_tasks, load_model, max_rel_err, rel_err
from altenv.graph.kernels import (
    _instrumented_run,
    _is_kernel,
    kernel_calls,
    profile_kernels,
)
from altenv.graph.network import build_network, build_plan, other_kernels
from altenv.graph.plan import plan_network
from altenv.graph.regen import Regenerable
from altenv.layout import Layout
from altenv.measure import MeasureConfig
from altenv.measure.chains import KernelChain
from altenv.pipeline.model import ModelRun, plan
from altenv.target import make_target
from altenv.tuning.others import open_database, tune_others


def _gelu() -> tirx.PrimFunc:
    x = te.placeholder((4, 64), name="x")
    y = te.compute((4, 64), lambda i, j: x[i, j] * (0.5 + tirx.erf(x[i, j] * 0.7071067811865476)
                                                    * 0.5), name="y")
    return te.create_prim_func([x, y])


def _run(func: tirx.PrimFunc, x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    out = tvm.runtime.tensor(np.zeros(shape, "float32"))
    tvm.compile(func, target="llvm")["main"](tvm.runtime.tensor(x), out)
    return out.numpy()


def test_fast_erf_in_a_regenerated_gelu_is_close_to_erf():
    """With ``fast_math=["erf"]`` the regenerated GELU calls no erf (TVM's polynomial
    instead) and stays within 1e-6 of the exact GELU, in a tiled output layout too."""
    regen = Regenerable.of(_gelu())
    x = np.random.default_rng(0).uniform(-5, 5, (4, 64)).astype("float32")
    exact = x * (0.5 + 0.5 * np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))
    tiled = Layout((4, 64)).split(1, [-1, 16]).reorder([1, 0, 2])
    plain, fast = regen.func({}, Layout((4, 64))), regen.func({}, Layout((4, 64)), ["erf"])
    assert "erf" in plain.script() and "erf" not in fast.script()
    assert np.abs(_run(fast, x, (4, 64)) - exact).max() < 1e-6
    out = _run(regen.func({}, tiled, ["erf"]), x, tiled.shape)
    assert np.abs(out - tiled.apply(exact.astype("float32"))).max() < 1e-6


def test_fast_exp_in_a_regenerated_sigmoid():
    """With ``fast_math=["exp"]`` a regenerated sigmoid (as a SiLU's epilogue is) calls
    neither sigmoid nor exp and stays within 1e-6 of the exact sigmoid."""
    x = te.placeholder((4, 64), name="x")
    regen = Regenerable.of(te.create_prim_func(
        [x, te.compute((4, 64), lambda i, j: tirx.sigmoid(x[i, j]), name="y")]))
    values = np.random.default_rng(0).uniform(-30, 30, (4, 64)).astype("float32")
    plain, fast = regen.func({}, Layout((4, 64))), regen.func({}, Layout((4, 64)), ["exp"])
    assert "sigmoid" in plain.script()
    assert "sigmoid" not in fast.script() and "T.exp(" not in fast.script()
    exact = 1 / (1 + np.exp(-values.astype(np.float64)))
    assert np.abs(_run(fast, values, (4, 64)) - exact).max() < 1e-6


def _conv_net(pool: bool) -> tvm.IRModule:
    """conv -> relu -> (a max pool) -> conv on a ``1 x 8 x 12 x 12`` input."""
    rng = np.random.default_rng(0)
    weights = [relax.const(rng.uniform(-1, 1, (8, 8, 3, 3)).astype("float32")) for _ in "12"]
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 12, 12], "float32"))
    with bb.function("main", [x], attrs={"num_input": 1}):
        with bb.dataflow():
            y = bb.emit_te(topi.nn.relu, bb.emit_te(topi.nn.conv2d_nchw, x, weights[0], 1, 1, 1))
            if pool:
                y = bb.emit_te(topi.nn.pool2d, y, [2, 2], [2, 2], [1, 1], [0, 0, 0, 0], "max")
            out = bb.emit_output(bb.emit_te(topi.nn.conv2d_nchw, y, weights[1], 1, 1, 1))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("pool", [False, True])
def test_a_network_without_other_kernels_searches_their_share(pool):
    """``budget.others`` goes to MetaSchedule where the network keeps a task as fused (the
    pool); with none (the relu fuses into the convolution) the layout search gets it."""
    cfg = RunConfig(name="n", model="x.py:f", budget=200)
    assert cfg.budget.others == 20
    run = ModelRun(cfg, None, None, _conv_net(pool), None, False)
    plan(run)
    assert plan_network(run.graph).kept == (["pool2d"] if pool else [])
    assert run.others == (20 if pool else 0)
    assert sum(run.budgets.values()) + run.reserved == 200 - run.others


def test_profile_times_every_kernel_main_calls():
    """The profile of the hand network: one row per PrimFunc ``main`` calls, its call count
    and kind (the two convolutions, the relu/add regenerated, the conversions)."""
    graph, _ = _hand_graph()
    network = build_network(graph, _hand_factors(graph))
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8, 12, 12)).astype("float32")
    source = network_baseline("n", network, [x]).kernels
    rows = profile_kernels({"n": source}, rounds=2)["n"]
    assert {r.name: r.calls for r in rows} == dict(kernel_calls(network.mod))
    assert sorted(r.kind for r in rows if r.kind == "c2d") == ["c2d", "c2d"]
    assert sum(r.calls for r in rows if r.kind == "conversion") == len(network.conversions)
    assert all(r.seconds > 0 and math.isfinite(r.spread) for r in rows)
    assert all(r.cold > 0 and r.cold_total == r.calls * r.cold for r in rows)  # cold on a CPU
    with pytest.raises(ValueError, match="flushes CPU caches"):  # a GPU's kernels: warm only
        KernelChain([], tvm.target.Target("cuda"), 0, cold=True)
    assert [r.total for r in rows] == sorted((r.total for r in rows), reverse=True)
    # inside the network (the baseline hands over its VM): every kernel timed there too
    assert all(math.isfinite(r.in_network) and r.in_network >= 0 for r in rows)
    assert sum(r.network_total for r in rows if r.kind == "c2d") > 0
    # the instrument's own cost is calibrated on a run with every kernel call skipped: each
    # skipped call is timed too, though the VM calls no after hook for it
    skipped = [(sym, sec) for sym, sec in _instrumented_run(source.vm, source.args, skip=True)
               if _is_kernel(sym)]
    assert len(skipped) == sum(kernel_calls(network.mod).values())
    assert all(0 < sec < 1e-3 for _, sec in skipped)


def test_on_a_cpu_generated_functions_keep_their_own_schedule():
    """The hand network's conversions and regenerated relu/add are MetaSchedule's to tune
    only off the CPU; on a CPU the build schedules them (``parallel_spatial``) and nothing
    is left to tune (it keeps no task as the frontend fused it)."""
    graph, _ = _hand_graph()
    plan = plan_network(graph, _hand_factors(graph))
    kinds = build_plan(plan).kinds
    generated = {name for name, kind in kinds.items() if not kind.startswith("c2d")}
    assert "conversion" in {kinds[name] for name in generated}
    assert "elemwise" in {kinds[name] for name in generated}
    cpu, _ = other_kernels(plan, target=make_target(None))
    gpu, _ = other_kernels(plan, target="cuda")
    assert cpu == {} and set(gpu) == generated


@pytest.mark.slow
def test_other_kernels_tuned_by_metaschedule_resume_and_build(tmp_path):
    """BERT-tiny (small) with default layouts: its layer norms and softmaxes are among the
    other kernels; MetaSchedule tunes them for 12 trials; a second call measures nothing
    more; the build takes the tuned schedules, and still matches torch."""
    model = load_model("bert_tiny", size="small")
    graph = extract_tasks(model)
    plan = plan_network(graph)
    kernels, through = other_kernels(plan)
    kinds = {graph.tasks[name].kind for name in kernels if name in graph.tasks}
    assert "reduce" in kinds and through == {}
    target = make_target(None)
    config = MeasureConfig(number=1, repeat=1, min_repeat_ms=0)
    records = tune_others(kernels, 12, tmp_path, target, config)
    assert records >= 12
    assert tune_others(kernels, 12, tmp_path, target, config) == records
    network = build_plan(plan, others=open_database(tmp_path))
    assert network.tuned_others and set(network.tuned_others) <= set(kernels)
    assert set(network.tuned_others) <= network.scheduled
    x = model.random_inputs(3)
    assert max_rel_err(network.run(x), model.reference(x)) < 1e-4
    assert rel_err(network.run(x)[0], build_plan(plan).run(x)[0]) < 1e-5
