"""Baselines in the same harness: MetaSchedule, untuned TVM and torch eager, checked against
references and timed interleaved."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from tvm import relax, te
from tvm.relax.frontend.torch import from_exported_program
from tvm.s_tir import dlight as dl
from tvm.s_tir.meta_schedule.search_strategy import EvolutionarySearch

from altenv.baselines import (
    Baseline,
    NoValidMeasurementsError,
    check_baseline,
    compare,
    torch_module_baseline,
    torch_operator_baseline,
    tune_relax_baseline,
    tune_tir_baseline,
    untuned_relax_baseline,
    untuned_tir_baseline,
    weight_names,
)
from altenv.baselines.base import untuned_rules
from altenv.measure import MeasureConfig, WrongResultError, as_module
from altenv.measure.timing import time_interleaved, wait_for_idle_threads
from altenv.ops import generate
from altenv.target import make_target

FAST = MeasureConfig(number=2, repeat=2, min_repeat_ms=0, build_workers=2)
TUNING = pytest.mark.xdist_group("baselines-tuning")  # tuning runs share one worker


def small_search() -> EvolutionarySearch:
    """MetaSchedule's evolutionary search with a test-sized population."""
    return EvolutionarySearch(population_size=32, init_min_unmeasured=8, genetic_num_iters=1)


@pytest.fixture(scope="session")
def target() -> tvm.target.Target:
    return make_target(None)


def test_interleaved_timer_gives_sane_medians() -> None:
    calls: list[str] = []

    def runner(name: str, seconds: float):
        def run() -> None:
            calls.append(name)
            time.sleep(seconds)  # sleeping, not spinning: robust on a loaded machine
        return run

    wants = {"a": 0.001, "b": 0.004, "c": 0.016}
    runs = {name: runner(name, want) for name, want in wants.items()}
    stats = time_interleaved(runs, rounds=5, min_block_seconds=0.006, cooldown_seconds=0.0)
    assert list(stats) == ["a", "b", "c"]
    for name, want in wants.items():
        s = stats[name]
        assert len(s.samples) == 5 and s.inner >= 1
        assert s.min <= s.iqr[0] <= s.median <= s.iqr[1] <= s.max
        assert want <= s.median < 1.5 * want + 0.002
    assert stats["a"].median < stats["b"].median < stats["c"].median
    assert stats["a"].inner > stats["c"].inner == 1
    timed = calls[2 * len(runs):]  # after two warm-up calls each, rounds interleave a, b, c
    inners = [stats[name].inner for name in runs]
    assert timed[: sum(inners)] == ["a"] * inners[0] + ["b"] * inners[1] + ["c"] * inners[2]


def test_waiting_for_idle_threads_outlasts_a_spinning_thread() -> None:
    finished = threading.Event()

    def spin() -> None:  # like a thread pool spinning after a parallel region
        start = time.thread_time()
        while time.thread_time() - start < 0.2:
            pass
        finished.set()

    spinner = threading.Thread(target=spin)
    spinner.start()
    wait_for_idle_threads(limit=10.0, window=0.02)
    assert finished.is_set()
    spinner.join()
    # with no other thread busy it returns after one window
    assert wait_for_idle_threads(limit=10.0, window=0.02) < 5.0


@pytest.mark.parametrize("spec,epilogue", [
    ("gmm:M=24,N=40,K=32", ()),
    ("c2d:N=1,I=8,O=16,H=10,W=10,KH=3,KW=3,stride=2,pad=1", ("bias", "relu")),
    ("c2d:N=1,I=16,O=8,H=6,W=6,KH=3,KW=3,pad=1", ("bias", "relu6")),
    ("grp:N=1,I=8,O=8,groups=4,H=8,W=8,KH=3,KW=3,pad=1", ()),
    ("t2d:N=1,I=4,O=6,H=5,W=5,KH=4,KW=4,stride=2,pad=1", ("residual",)),
    ("c2d:N=1,I=64,O=128,H=2,W=2,KH=1,KW=1,stride=2", ()),  # 1x1 output: GEMV-shaped
])
def test_untuned_and_torch_match_the_reference(spec: str, epilogue: tuple[str, ...],
                                              target: tvm.target.Target) -> None:
    program = generate(spec, epilogue=epilogue)
    raw = program.random_inputs(3)
    expected = [program.reference(raw)]
    default = untuned_tir_baseline(program, target=target, raw=raw)
    eager = torch_operator_baseline(program, target=target, raw=raw)
    assert check_baseline(default, expected) < 1e-5
    assert check_baseline(eager, expected) < 1e-5
    assert torch.get_num_threads() == int(target.attrs["num-cores"])


def test_untuned_rules_schedule_reductions_and_leave_gemv_shaped_convs(target) -> None:
    """dlight's GEMV rule would turn this conv into 128-lane gathers that LLVM needs minutes
    to compile on AVX-512; the untuned builds leave it to TVM's default lowering."""
    conv = generate("c2d:N=1,I=64,O=128,H=2,W=2,KH=1,KW=1,stride=2").func
    x = te.placeholder((16, 64), name="x")
    k = te.reduce_axis((0, 64), name="k")
    sums = te.compute((16,), lambda i: te.sum(x[i, k], axis=k), name="sums")
    means = te.create_prim_func([x, te.compute((16,), lambda i: sums[i] / 64.0)])
    with target:
        assert dl.cpu.GEMV().apply(conv, target, False) is not None
        scheduled = [untuned_rules()(as_module(f))["main"].attrs for f in (conv, means)]
    assert ["tirx.is_scheduled" in (attrs or {}) for attrs in scheduled] == [False, True]


def test_a_wrong_baseline_is_rejected_before_timing() -> None:
    program = generate("gmm:M=8,N=8,K=8")
    raw = program.random_inputs(0)
    good = untuned_tir_baseline(program, raw=raw)
    bad = Baseline("bad", good.run, lambda: [good.outputs()[0] * 1.01])
    with pytest.raises(WrongResultError, match="bad: wrong result"):
        compare([good, bad], [program.reference(raw)])


def _tuned_and_compared(spec: str, tmp_path: Path, target: tvm.target.Target) -> Baseline:
    program = generate(spec)
    raw = program.random_inputs(1)
    tuned = tune_tir_baseline(program, tmp_path / "ms", 8, target=target, config=FAST, raw=raw,
                              strategy=small_search())
    assert tuned.tuning is not None
    assert tuned.tuning.trials == 8 and 0 < tuned.tuning.valid <= 8
    assert 0 < tuned.tuning.best_seconds < 1 and tuned.tuning.tuning_seconds > 0
    others = [untuned_tir_baseline(program, target=target, raw=raw),
              torch_operator_baseline(program, target=target, raw=raw)]
    stats = compare([tuned, *others], [program.reference(raw)], rounds=3)
    assert set(stats) == {"metaschedule", "tvm-default", "torch"}
    assert all(0 < s.median < 1 for s in stats.values())
    return tuned


@pytest.mark.slow
@TUNING
def test_tune_tir_matmul_measures_and_is_correct(tmp_path: Path, target) -> None:
    _tuned_and_compared("gmm:M=32,N=32,K=32", tmp_path, target)


@pytest.mark.slow
@TUNING
def test_tune_tir_conv2d_measures_and_is_correct(tmp_path: Path, target) -> None:
    _tuned_and_compared("c2d:N=1,I=8,O=8,H=8,W=8,KH=3,KW=3,pad=1", tmp_path, target)


@pytest.mark.slow
@TUNING
def test_tuning_without_valid_measurements_raises(tmp_path: Path, target) -> None:
    config = FAST.model_copy(update={"build_timeout": 1e-3, "builder_preload": [],
                                     "build_workers": 1})  # every build times out
    with pytest.raises(NoValidMeasurementsError, match="4 candidates measured, none valid"):
        tune_tir_baseline(generate("gmm:M=16,N=16,K=16"), tmp_path, 4, target=target,
                          config=config, strategy=small_search())


class TwoLayers(torch.nn.Module):
    """conv + relu, then a dense layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


@pytest.mark.slow
@TUNING
def test_network_baselines_match_torch(tmp_path: Path, target) -> None:
    torch.manual_seed(0)
    model = TwoLayers().eval()
    x = torch.rand(1, 4, 6, 6) + 0.5
    mod = from_exported_program(torch.export.export(model, (x,)), keep_params_as_input=True)
    mod, detached = relax.frontend.detach_params(mod)
    params = dict(zip(weight_names(mod), (v.numpy() for v in detached["main"])))
    inputs = [x.numpy()]
    with torch.no_grad():
        expected = [model(x).numpy()]
    tuned = tune_relax_baseline(mod, params, inputs, tmp_path, 8, target=target, config=FAST,
                                strategy=small_search())
    assert tuned.tuning is not None and tuned.tuning.trials == 8 and tuned.tuning.valid > 0
    baselines = [tuned, untuned_relax_baseline(mod, params, inputs, target=target),
                 torch_module_baseline(model, inputs, target=target)]
    stats = compare(baselines, expected, rtol=1e-4, rounds=3)
    assert all(0 < s.median < 1 for s in stats.values())
    assert np.isfinite([s.spread for s in stats.values()]).all()


def test_metaschedule_rounds_reach_every_task_of_a_network() -> None:
    from altenv.baselines.network import round_size
    assert round_size(2000, 21) == 64  # MetaSchedule's default where it covers every task
    assert round_size(2000, 66) == 30  # MobileNet-V3-Small: 66 rounds fit in 2000
    assert round_size(100, 66) == 8    # never below 8 candidates a round
    assert round_size(2000, 0) == 64


def _failing_setup():
    raise ValueError("no such model")


def test_isolated_run_times_blocks_in_its_own_process():
    from altenv.baselines.isolated import IsolatedRun

    program = generate("gmm:M=16,N=8,K=32")
    raw = program.random_inputs(1)
    torch_run = torch_operator_baseline(program, raw=raw)
    assert torch_run.worker is not None and "own process" in torch_run.notes
    check_baseline(torch_run, [program.reference(raw)])
    assert torch_run.worker.block(3) > 0
    stats = compare([torch_run], [program.reference(raw)], rounds=2)
    assert stats["torch"].median > 0
    process = torch_run.worker._process
    torch_run.worker.close()
    assert process.poll() is not None
    with pytest.raises(RuntimeError, match="isolated baseline: ValueError: no such model"):
        IsolatedRun(_failing_setup, 1)


def test_a_wrong_tuned_function_is_built_untuned_and_named(target) -> None:
    """A tuned program that computes wrong results (here: a doubled add standing in for
    MetaSchedule's layout rewrite of BERT's token-type table, which drops the row index) is
    found by trying each tuned function alone, and built untuned; the rest stays tuned."""
    from altenv.baselines.network import _checked_build
    from altenv.graph.build import with_func

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([4, 16], "float32"))
    w = relax.Var("w", relax.TensorType([4, 16], "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            added = bb.emit_te(lambda a, b: te.compute(a.shape, lambda i, j: a[i, j] + b[i, j],
                                                       name="add"), x, w, primfunc_name_hint="add")
            out = bb.emit_output(bb.emit_te(lambda a: te.compute(
                a.shape, lambda i, j: a[i, j] * 3.0, name="scale"), added,
                primfunc_name_hint="scale"))
        bb.emit_func_output(out)
    fused = bb.get()
    doubled = te.placeholder((4, 16), name="a"), te.placeholder((4, 16), name="b")
    wrong = te.create_prim_func([*doubled, te.compute(
        (4, 16), lambda i, j: 2.0 * (doubled[0][i, j] + doubled[1][i, j]))])
    sch = tvm.s_tir.Schedule(fused["scale"])
    sch.parallel(sch.get_loops(sch.get_sblock("scale"))[0])  # a correct tuned function
    applied = with_func(with_func(fused, "add", wrong.without_attr("global_symbol")),
                        "scale", sch.mod["main"])
    rng = np.random.default_rng(0)
    xs, ws = (rng.uniform(-1, 1, (4, 16)).astype("float32") for _ in range(2))
    weights = [tvm.runtime.tensor(ws)]
    executable, untuned, compiled = _checked_build(fused, applied, target, False, [xs],
                                                    weights)
    assert untuned == ["add"]
    tvm.ir.assert_structural_equal(compiled["add"], fused["add"])  # what was compiled
    vm = relax.VirtualMachine(executable, tvm.cpu(0))
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(xs), *weights).numpy(),
                               (xs + ws) * 3.0, rtol=1e-6)
