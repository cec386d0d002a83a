"""Whole-network build with per-task layouts (ALT's graph level) and export for deployment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import tvm
from test_spatial import loops_of
from tvm import relax, tirx, topi

from altenv.export import MANIFEST_FILE, MODEL_FILE, PARAMS_FILE, export_run
from altenv.graph import extract_tasks, load_model, max_rel_err, rel_err
from altenv.graph.lowering import ComplexLowering
from altenv.graph.network import build_network
from altenv.graph.plan import op_name, plan_network, tensor_name
from altenv.graph.read_through import GUARDED, staged_variants
from altenv.graph.scheduler import canonical
from altenv.graph.tasks import TaskGraph, graph_of
from altenv.layout import Layout
from altenv.ops import LayoutTemplate, parse_workload
from altenv.target import make_target

ROOT = Path(__file__).resolve().parents[1]


def random_factors(graph: TaskGraph, seed: int) -> dict[str, dict[str, int]]:
    """Random legal template factors (ALT Eq. 2) for every complex task with a template."""
    rng = np.random.default_rng(seed)
    out = {}
    for task in graph.complex_tasks():
        try:
            template = LayoutTemplate(task.op.spec())
        except ValueError:
            continue  # no template for this workload: the build falls back with a warning
        for _ in range(50):
            factors = template.factors_from_actions(rng.uniform(0, 1, len(template.knobs)))
            try:
                template.layouts(factors)
            except ValueError:  # e.g. a strided 1x1 conv's input cannot unfold with gaps
                continue
            out[task.name] = factors
            break
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "bert_tiny", "r3d_18"])
def test_zoo_with_random_layouts_matches_torch(name: str):
    model = load_model(name, size="small")
    graph = extract_tasks(model)
    factors = random_factors(graph, seed=len(name))
    network = build_network(graph, factors)
    assert network.plan.layouts, "no complex task was generated with layouts"
    tiled = [t for t, f in network.plan.factors.items() if f != LayoutTemplate(
        graph.tasks[t].op.spec()).default_factors()]
    assert tiled, "the random factors should tile some task"
    x = model.random_inputs(1)
    assert max_rel_err(network.run(x), model.reference(x)) < 1e-4
    # weights are parameters of main, already in their physical layouts
    assert not [c for c in network.mod["main"].script().splitlines() if "metadata[" in c]
    assert len(network.params) == len(network.mod["main"].params) - len(model.inputs)
    # every complex call that would convert its data operand reads it as stored instead
    # (BERT's matmuls read theirs from elementwise tasks that already write their layouts)
    through = build_network(graph, factors, read_through=range(len(graph.calls)))
    data_of = {f"call{i}": network.plan.dataflow.op(f"call{i}").inputs[0]
               for i in network.plan.lowerings}
    assert not [c for c in through.conversions if data_of.get(c.consumer) == c.tensor]
    assert len(through.conversions) <= len(network.conversions)
    assert bool(through.reads_through) == (name != "bert_tiny")
    assert max_rel_err(through.run(x), model.reference(x)) < 1e-4


ACTIVATIONS = '''
import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    """Convolutions followed by SiLU, hardswish and GELU, as MobileNetV3 or a ConvNeXt."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        return F.gelu(self.c(F.hardswish(self.b(F.silu(self.a(x))))))


def make():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 4, 8, 8) * 3,)
'''


@pytest.mark.parametrize("fast_math,steps", [((), ("silu", "hardswish", "gelu")), (
    ("erf", "exp"), ("fast_silu", "hardswish", "fast_gelu"))])
def test_convs_with_silu_hardswish_gelu_are_tuned_with_layouts(tmp_path: Path, fast_math,
                                                               steps):
    """The activations Relax fuses after each conv are generated in the conv's tiled
    output layout (no call falls back), with TVM's fast ``exp`` and ``erf`` where
    ``fast_math`` names them, and the network still computes what torch does."""
    (tmp_path / "act.py").write_text(ACTIVATIONS)
    model = load_model(f"{tmp_path / 'act.py'}:make")
    graph = extract_tasks(model)
    factors = {task.name: {**LayoutTemplate(task.op.spec()).default_factors(), "ot": 4,
                           "ht": 4} for task in graph.complex_tasks()}
    network = build_network(graph, factors, fast_math=fast_math)
    plan = network.plan
    assert not plan.fallbacks
    assert [plan.lowerings[c.index].epilogue for c in graph.complex_calls()] == [
        ("bias", step) for step in steps]
    assert {plan.layouts[t]["out"].shape for t in factors} == {(1, 2, 1, 2, 4, 8, 4)}
    x = model.random_inputs(1)
    assert max_rel_err(network.run(x), model.reference(x)) < 1e-4


def _hand_graph(hw: int = 12) -> tuple[TaskGraph, dict[str, np.ndarray]]:
    """conv1 -> relu -> add(., x) -> conv2 as four separate tasks (no fusion), on a
    ``1 x 8 x hw x hw`` input."""
    rng = np.random.default_rng(0)
    w1 = rng.uniform(-1, 1, (8, 8, 3, 3)).astype("float32")
    w2 = rng.uniform(-1, 1, (16, 8, 3, 3)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, hw, hw], "float32"))
    with bb.function("main", [x], attrs={"num_input": 1}):
        with bb.dataflow():
            c1 = bb.emit_te(topi.nn.conv2d_nchw, x, relax.const(w1), 1, 1, 1,
                            primfunc_name_hint="conv1")
            r = bb.emit_te(topi.nn.relu, c1, primfunc_name_hint="relu")
            a = bb.emit_te(topi.add, r, x, primfunc_name_hint="add")
            c2 = bb.emit_te(topi.nn.conv2d_nchw, a, relax.const(w2), 1, 1, 1,
                            primfunc_name_hint="conv2")
            out = bb.emit_output(c2)
        bb.emit_func_output(out)
    return graph_of(bb.get()), {"w1": w1, "w2": w2}


def _hand_factors(graph: TaskGraph) -> dict[str, dict[str, int]]:
    """Tiled layouts for both convolutions of :func:`_hand_graph`."""
    conv1, conv2 = (c.task for c in graph.complex_calls())
    return {conv1: {"ht": 4, "wt": 6, "ot": 4, "it": 2, "it_w": 4, "ot_w": 2},
            conv2: {"ht": 3, "wt": 4, "ot": 8, "it": 4, "it_w": 2, "ot_w": 8}}


def test_conv_relu_add_conv_end_to_end():
    """conv1's tiled output propagates through relu; the add reads it in that layout and
    writes conv2's padded, unfolded input layout itself (Fig. 5b): the only conversions are
    the input's pad-and-convert and the output's conversion back to logical."""
    graph, w = _hand_graph()
    network = build_network(graph, _hand_factors(graph))
    prop, chosen = network.plan.propagation, network.plan.chosen
    assert prop.storage[tensor_name(1)] == chosen["call0"]["out"]           # relu
    assert prop.storage[tensor_name(2)] == chosen["call3"]["data"]          # add -> conv2
    assert chosen["call3"]["data"].has_nontrivial_advanced()
    assert [(c.tensor, c.consumer) for c in network.conversions] == [
        ("in:x", "call0"), (tensor_name(3), "output")]
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8, 12, 12)).astype("float32")
    t = torch.from_numpy
    y = torch.relu(torch.conv2d(t(x), t(w["w1"]), padding=1)) + t(x)
    ref = torch.conv2d(y, t(w["w2"]), padding=1).numpy()
    assert rel_err(network.run([x])[0], ref) < 1e-5


def test_without_conversions_empties_only_the_conversions():
    """The twin that prices the conversions (``bench net``'s ``conversion_share``): the same
    calls, every conversion PrimFunc a no-op, every other function untouched."""
    from altenv.bench.net import conversion_cost

    graph, _ = _hand_graph()
    network = build_network(graph, _hand_factors(graph))
    twin = network.without_conversions()
    emptied = {c.func for c in network.conversions}
    assert len(emptied) == 2
    for gv, func in network.mod.functions.items():
        other = twin.mod[gv.name_hint]
        if gv.name_hint in emptied:
            assert isinstance(other.body, tirx.Evaluate) and other.params == func.params
        else:
            tvm.ir.assert_structural_equal(other, func)
    x = np.random.default_rng(3).uniform(-1, 1, (1, 8, 12, 12)).astype("float32")
    assert rel_err(twin.run([x])[0], network.run([x])[0]) > 1e-2
    conv, total = conversion_cost(network, [x], rounds=3)
    assert total > 0 and conv < total


def test_network_programs_are_timed_on_the_targets_cores(monkeypatch):
    """TVM's own pool default is half the hardware threads (one on a 2-vCPU machine): a
    network baseline sets the target's cores before it is timed, whatever ran before."""
    from altenv.baselines import network_baseline
    from altenv.target import host_cpu_target, use_tvm_threads

    monkeypatch.setenv("TVM_NUM_THREADS", "1")
    graph, _ = _hand_graph()
    target = host_cpu_target(3)
    x = np.random.default_rng(4).uniform(-1, 1, (1, 8, 12, 12)).astype("float32")
    try:
        network_baseline("n", build_network(graph, target=target), [x])
        assert os.environ["TVM_NUM_THREADS"] == "3"
    finally:
        use_tvm_threads(len(os.sched_getaffinity(0)))


def _parallel_funcs(network) -> set[str]:
    """The PrimFuncs of the network's module with a parallel loop."""
    return {gv.name_hint for gv, func in network.mod.functions.items()
            if isinstance(func, tirx.PrimFunc)
            and tirx.ForKind.PARALLEL in [lp.kind for lp in loops_of(func)]}


def test_generated_spatial_funcs_run_in_parallel_on_a_multicore_cpu():
    """The input's pad-and-convert and the add that writes conv2's padded input are spread
    over the target's cores (the untuned convolutions are not touched); one core keeps them
    serial; both compute the same numbers as torch."""
    from altenv.target import host_cpu_target

    graph, w = _hand_graph(hw=32)
    x = np.random.default_rng(5).uniform(-1, 1, (1, 8, 32, 32)).astype("float32")
    t = torch.from_numpy
    y = torch.relu(torch.conv2d(t(x), t(w["w1"]), padding=1)) + t(x)
    ref = torch.conv2d(y, t(w["w2"]), padding=1).numpy()
    multi = build_network(graph, target=host_cpu_target(2))
    conversions = {c.func for c in multi.conversions}
    assert conversions and conversions <= _parallel_funcs(multi)
    assert any(name.startswith("add") for name in _parallel_funcs(multi))
    assert not any(name.startswith("conv") for name in _parallel_funcs(multi))
    single = build_network(graph, target=host_cpu_target(1))
    assert not _parallel_funcs(single)
    for network in (multi, single):
        assert rel_err(network.run([x])[0], ref) < 1e-5


def test_tasks_kept_as_they_are_get_cpu_schedules():
    """BERT-tiny's layer norms and softmaxes are not tuned: on two cores they run their rows
    in parallel (dlight's CPU reduction rule); one core leaves them alone; the network still
    matches torch."""
    from altenv.target import host_cpu_target

    model = load_model("bert_tiny", size="small")
    graph = extract_tasks(model)
    kept = {c.task for c in graph.calls if c.op is None and c.task.startswith(
        ("layer_norm", "fused_softmax"))}
    assert kept
    x = model.random_inputs(2)
    multi = build_network(graph, target=host_cpu_target(2))
    assert kept <= _parallel_funcs(multi)
    assert max_rel_err(multi.run(x), model.reference(x)) < 1e-4
    single = build_network(graph, target=host_cpu_target(1))
    assert not kept & _parallel_funcs(single)


def test_fold_batch_norm_into_weight_and_bias():
    spec = "c2d:N=1,I=2,H=4,W=4,O=3,KH=1,KW=1"
    lowering = ComplexLowering(spec, 0, 1, False,
                               (("sub", 2), ("div", 3), ("mul", 4), ("add", 5)), None,
                               "relu", ((0, 0),) * 4, parse_workload(spec))
    rng = np.random.default_rng(0)
    weight = rng.uniform(-1, 1, (3, 2, 1, 1))
    consts = {k: rng.uniform(0.5, 1.5, (1, 3, 1, 1)) for k in (2, 3, 4, 5)}
    folded, bias = lowering.fold(weight, consts, 1, 4)
    x = rng.uniform(-1, 1, (1, 2, 4, 4))
    conv = np.einsum("oi,nihw->nohw", weight[:, :, 0, 0], x)
    bn = (conv - consts[2]) / consts[3] * consts[4] + consts[5]
    got = np.einsum("oi,nihw->nohw", folded[:, :, 0, 0], x) + bias.reshape(1, 3, 1, 1)
    assert np.allclose(got, bn)
    assert lowering.epilogue == ("bias", "relu")


def test_a_call_reads_its_input_as_stored_instead_of_converting():
    """With ``read_through`` conv1 reads the network input in its logical layout, the pads as
    guarded reads: the input's pad-and-convert is gone. conv2 needs no conversion (the add
    writes its padded input) and keeps its own; the numbers do not change."""
    graph, w = _hand_graph()
    network = build_network(graph, _hand_factors(graph), read_through=range(4))
    assert network.reads_through == {0: GUARDED}
    assert [(c.tensor, c.consumer) for c in network.conversions] == [(tensor_name(3), "output")]
    x = np.random.default_rng(6).uniform(-1, 1, (1, 8, 12, 12)).astype("float32")
    t = torch.from_numpy
    y = torch.relu(torch.conv2d(t(x), t(w["w1"]), padding=1)) + t(x)
    ref = torch.conv2d(y, t(w["w2"]), padding=1).numpy()
    assert rel_err(network.run([x])[0], ref) < 1e-5


def _conv_chain() -> tuple[TaskGraph, dict[str, np.ndarray]]:
    """conv(3x3) -> conv(1x1) -> conv(3x3), each feeding the next directly, on 1x8x10x10."""
    rng = np.random.default_rng(7)
    ws = {"w1": rng.uniform(-1, 1, (8, 8, 3, 3)), "w2": rng.uniform(-1, 1, (16, 8, 1, 1)),
          "w3": rng.uniform(-1, 1, (8, 16, 3, 3))}
    ws = {k: v.astype("float32") for k, v in ws.items()}
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([1, 8, 10, 10], "float32"))
    with bb.function("main", [x], attrs={"num_input": 1}):
        with bb.dataflow():
            y = x
            for k, (name, pad) in enumerate([("w1", 1), ("w2", 0), ("w3", 1)]):
                y = bb.emit_te(topi.nn.conv2d_nchw, y, relax.const(ws[name]), 1, pad, 1,
                               primfunc_name_hint=f"conv{k}")
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    return graph_of(bb.get()), ws


@pytest.mark.slow
def test_tuned_schedules_replay_on_calls_that_read_through():
    """Three convolutions in a row with tiled layouts and sampled schedules: each reads its
    producer's blocked output as stored (conv1 and conv3 with their pads as guarded reads),
    its schedule replayed on that variant; or converts it inside, the conversion staged at
    one of three loops of its schedule; ``"measure"`` keeps, per call, the fastest of the
    ways it can get its input. Every build matches torch."""
    from altenv.tuning import OpTask, freeze

    graph, ws = _conv_chain()
    target = "llvm"
    factors = {c.task: f for c, f in zip(graph.complex_calls(), [
        {"ht": 5, "wt": 2, "ot": 4, "it": 2, "it_w": 4, "ot_w": 2},
        {"ht": 2, "wt": 10, "ot": 8, "it": 8, "it_w": 8, "ot_w": 8},
        {"ht": 10, "wt": 5, "ot": 2, "it": 4, "it_w": 2, "ot_w": 4}])}
    plan = plan_network(graph, factors)
    schedules = {}
    for index, lowering in plan.lowerings.items():
        task = graph.calls[index].task
        op_task = OpTask(lowering.spec, target, lowering.epilogue)
        space = op_task.space(freeze(factors[task]))
        schedules[task] = space.decode(space.sample(1, seed=index)[0])
    x = np.random.default_rng(8).uniform(-1, 1, (1, 8, 10, 10)).astype("float32")
    y = torch.from_numpy(x)
    for k, pad in enumerate([1, 0, 1]):
        y = torch.conv2d(y, torch.from_numpy(ws[f"w{k + 1}"]), padding=pad)
    converting = build_network(graph, factors, schedules, target)
    assert [c.consumer for c in converting.conversions][:3] == ["call0", "call1", "call2"]
    through = build_network(graph, factors, schedules, target, read_through=[0, 1, 2])
    assert through.reads_through == {0: GUARDED, 1: GUARDED, 2: GUARDED}
    assert [c.consumer for c in through.conversions] == ["output"]
    assert len(through.scheduled) == 3
    # the conversions staged inside the calls: at the outermost, the next and the innermost
    # loop that give distinct functions
    staged_at = {}
    for index, lowering in plan.lowerings.items():
        task = graph.calls[index].task
        storage = canonical(plan.propagation.layout_of(
            plan.dataflow.op(op_name(index)).inputs[0], plan.dataflow.shapes))
        want = canonical(plan.chosen[op_name(index)]["data"])
        positions = sorted(staged_variants(lowering.func(plan.layouts[task], (storage, want)),
                                           schedules[task].trace, make_target(target)))
        assert len(positions) >= 3, (index, positions)
        staged_at[index] = positions
    picks = [{i: at[k] for i, at in staged_at.items()} for k in (0, 1, -1)]
    staged = [build_network(graph, factors, schedules, target, read_through=pick)
              for pick in picks]
    for pick, network in zip(picks, staged):
        assert network.reads_through == pick
        assert [c.consumer for c in network.conversions] == ["output"]
    measured = build_network(graph, factors, schedules, target, read_through="measure")
    assert set(measured.reads_through) <= {0, 1, 2}
    assert all(how == GUARDED or how in staged_at[i] for i, how in measured.reads_through.items())
    assert len(measured.conversions) == len(converting.conversions) - len(measured.reads_through)
    for network in (converting, through, measured, *staged):
        assert rel_err(network.run([x])[0], y.numpy()) < 1e-5


def test_untiled_layouts_convert_only_to_pad_inputs():
    """Default (untiled) layouts: the pad-and-convert producer of each conv input is a pure
    pad; the output's storage holds the logical bytes, so returning it is a reshape (a view),
    not a conversion."""
    graph, w = _hand_graph()
    network = build_network(graph)
    assert [(c.tensor, c.consumer) for c in network.conversions] == [("in:x", "call0")]
    assert network.conversions[0].dst == Layout((1, 8, 12, 12)).pad(2, 1, 1).pad(3, 1, 1)
    assert "R.reshape" in network.mod["main"].script()
    x = np.random.default_rng(2).uniform(-1, 1, (1, 8, 12, 12)).astype("float32")
    t = torch.from_numpy
    y = torch.relu(torch.conv2d(t(x), t(w["w1"]), padding=1)) + t(x)
    ref = torch.conv2d(y, t(w["w2"]), padding=1).numpy()
    assert rel_err(network.run([x])[0], ref) < 1e-5


FACTORY = '''
import torch
from torch import nn


class Net(nn.Module):
    """Written by somebody else: depthwise, dilated, grouped and plain convs, residual adds,
    a linear head."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.dil = nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.grp = nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=4)
        self.pw = nn.Conv2d(32, 32, 1)
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        y = torch.relu(self.bn(self.stem(x)))
        y = y + torch.clamp(self.dw(y), 0, 6)
        y = torch.relu(self.dil(y) + y)
        y = self.grp(y)
        y = torch.relu(self.pw(y) + y)
        return self.head(y.mean((2, 3)))


def make():
    net = Net()
    net.bn.running_mean.uniform_(-0.5, 0.5)
    net.bn.running_var.uniform_(0.5, 1.5)
    return net, (torch.randn(1, 3, 16, 16),)
'''


@pytest.mark.slow
def test_foreign_module_exported_and_reloaded_in_a_fresh_process(tmp_path: Path):
    source = tmp_path / "foreign.py"
    source.write_text(FACTORY)
    model = load_model(f"{source}:make")
    graph = extract_tasks(model)
    assert {c.op.kind for c in graph.complex_calls()} >= {"c2d", "dep", "dil", "grp", "gmm"}
    out_dir, network = export_run(model, tmp_path / "export", random_factors(graph, seed=3))
    # clamp-then-add is outside the generator's epilogues: that conv keeps its own task,
    # reading and writing logical tensors through conversions
    assert list(network.plan.fallbacks.values()) == [
        "an epilogue step reading a tensor after an activation"]
    assert {c.consumer for c in network.conversions} >= {"call1"}
    for name in (MODEL_FILE, PARAMS_FILE, MANIFEST_FILE):
        assert (out_dir / name).is_file()
    manifest = json.loads((out_dir / MANIFEST_FILE).read_text())
    assert manifest["source_hash"] == model.source_hash
    assert [i["name"] for i in manifest["inputs"]] == [i.name for i in model.inputs]
    assert set(manifest["tasks"]) == set(network.plan.layouts)
    layouts = next(iter(manifest["tasks"].values()))["layouts"]
    assert Layout.from_json(layouts["out"]).shape  # layouts replay from the manifest

    _check_reloaded_in_a_fresh_process(model, network, out_dir, tmp_path)


def _check_reloaded_in_a_fresh_process(model, network, out_dir: Path, tmp_path: Path) -> None:
    """The export, loaded with plain TVM in a fresh process, computes what the build and
    torch compute."""
    x = model.random_inputs(5)
    np.savez(tmp_path / "in.npz", **{i.name: v for i, v in zip(model.inputs, x)})
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "load_exported.py"), str(out_dir),
         "--inputs", str(tmp_path / "in.npz"), "--save", str(tmp_path / "out.npz")],
        capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ""}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    saved = np.load(tmp_path / "out.npz")
    reloaded = [saved[f"out{i}"] for i in range(len(saved.files))]
    assert max_rel_err(reloaded, network.run(x)) < 1e-6
    assert max_rel_err(reloaded, model.reference(x)) < 1e-4


MOBILE = '''
import torch
from torch import nn
from torch.nn import functional as F


class Net(nn.Module):
    """Squeeze-excite, a channel split and shuffle, casts and transposed convolutions."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(4, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.Hardswish())
        self.fc1, self.fc2 = nn.Conv2d(8, 4, 1), nn.Conv2d(4, 8, 1)
        self.branch = nn.Conv2d(4, 4, 1)
        self.up = nn.Sequential(nn.ConvTranspose2d(8, 4, 4, 2, 1), nn.BatchNorm2d(4), nn.ReLU())
        self.out = nn.ConvTranspose2d(4, 3, 3, 2, 1, output_padding=1)

    def forward(self, x):
        x = self.stem(x)
        x = x * F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))
        a, b = x.chunk(2, dim=1)
        b = self.branch(b)
        b = (b * (b > 0).float()).half().float()
        x = torch.cat((a, b), 1)
        n, c, h, w = x.shape
        x = x.reshape(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)
        return torch.tanh(self.out(self.up(x)))


def make():
    torch.manual_seed(0)
    net = Net().eval()
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return net, (torch.randn(1, 4, 8, 8),)
'''


VOLUME = '''
import torch
from torch import nn


class Net(nn.Module):
    """A 3-D decoder step: a convolution, then a transposed one with output padding."""

    def __init__(self):
        super().__init__()
        self.down = nn.Conv3d(3, 8, 3, 2, 1)
        self.up = nn.Sequential(nn.ConvTranspose3d(8, 4, 3, 2, 1, output_padding=1),
                                nn.BatchNorm3d(4), nn.ReLU())

    def forward(self, x):
        return self.up(torch.relu(self.down(x)))


def make():
    torch.manual_seed(0)
    net = Net().eval()
    net.up[1].running_mean.uniform_(-0.2, 0.2)
    net.up[1].running_var.uniform_(0.5, 1.5)
    return net, (torch.randn(1, 3, 6, 8, 8),)
'''


@pytest.mark.slow
def test_transposed_3d_convolution_imports_and_is_tuned_with_layouts(tmp_path: Path):
    """``ConvTranspose3d``, which TVM's importer refuses, imports through altenv's converter
    and is tuned with layouts (its batch norm folded); the export matches torch."""
    (tmp_path / "volume.py").write_text(VOLUME)
    model = load_model(f"{tmp_path / 'volume.py'}:make")
    graph = extract_tasks(model)
    assert [c.op.spec() for c in graph.complex_calls()][-1] == \
        "t3d:N=1,I=8,D=3,H=4,W=4,O=4,KD=3,KH=3,KW=3,stride=2,pad=1,opad=1"
    out_dir, network = export_run(model, tmp_path / "export", random_factors(graph, 1))
    assert not network.plan.fallbacks and len(network.plan.lowerings) == 2
    _check_reloaded_in_a_fresh_process(model, network, out_dir, tmp_path)


@pytest.mark.slow
def test_mobile_constructs_tuned_with_layouts_at_batch_2_and_exported(tmp_path: Path, caplog):
    """Squeeze-excite (its gate product split from the 1x1 conv), a channel split, concat
    and shuffle, casts in an epilogue, a transposed conv with batch norm and one with
    output padding are tuned with layouts at batch 2, nothing falls back, and the export
    matches torch in a fresh process."""
    (tmp_path / "mobile.py").write_text(MOBILE)
    model = load_model(f"{tmp_path / 'mobile.py'}:make", batch=2)
    assert model.inputs[0].shape == (2, 4, 8, 8)
    graph = extract_tasks(model)
    with caplog.at_level("WARNING", logger="altenv.graph"):
        out_dir, network = export_run(model, tmp_path / "export", random_factors(graph, 2))
    plan = network.plan
    assert [plan.lowerings[i].epilogue for i in sorted(plan.lowerings)] == [
        ("bias", "hardswish"), ("bias", "relu"), ("bias", "div(max(min(x,6.0),0.0),6.0)"),
        ("bias", "float16(mul(x,select(lt(0.0,x),1.0,0.0)))"), ("bias", "relu"),
        ("bias", "tanh")]
    up, out = (plan.lowerings[i].spec for i in sorted(plan.lowerings)[-2:])
    assert up.startswith("t2d:N=2,I=8,H=4,W=4,O=4") and out.endswith("stride=2,pad=1,opad=1")
    assert not plan.fallbacks and not [r for r in caplog.records if r.levelname == "WARNING"]
    _check_reloaded_in_a_fresh_process(model, network, out_dir, tmp_path)
