"""Whole-network build with default schedules, numerics against torch, the replacement hook."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tvm import s_tir

from altenv.graph import build, extract_tasks, load_model, max_rel_err, rel_err
from altenv.graph.build import apply_replacements

FACTORY = '''
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.clamp(self.dw(y), 0, 6) + y
        return self.fc(y.mean((2, 3)))

def make():
    net = Net()
    net.bn.running_mean.uniform_(-0.5, 0.5)
    net.bn.running_var.uniform_(0.5, 1.5)
    return net, (torch.randn(2, 3, 8, 8),)
'''


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("net") / "net.py"
    path.write_text(FACTORY)
    model = load_model(f"{path}:make")
    return model, extract_tasks(model)


def test_default_build_matches_torch(small):
    model, graph = small
    built = build(graph)
    for seed in (0, 1):
        x = model.random_inputs(seed)
        assert not np.all(x[0] == 0)
        assert max_rel_err(built.run(x), model.reference(x)) < 1e-5


def _parallel_schedule(func, block: str) -> s_tir.Schedule:
    sch = s_tir.Schedule(func)
    loops = sch.get_loops(sch.get_sblock(block))
    outer, _ = sch.split(loops[1], factors=[None, 4])
    sch.parallel(outer)
    return sch


def test_replacement_hook(small):
    model, graph = small
    conv = graph.complex_calls()[0]
    task = graph.tasks[conv.task]
    sch = _parallel_schedule(task.func, task.op.block)
    built = build(graph, replacements={task.name: sch})
    x = model.random_inputs(3)
    assert max_rel_err(built.run(x), model.reference(x)) < 1e-5
    # the module that was compiled holds the scheduled function
    assert "T.parallel" in apply_replacements(graph, {task.name: sch})[task.name].script()
    assert "T.parallel" not in graph.mod[task.name].script()


def test_replacement_rejects_other_signature(small):
    _, graph = small
    first, second = graph.complex_tasks()[:2]
    with pytest.raises(ValueError, match="signature"):
        build(graph, replacements={first.name: second.func})
    with pytest.raises(KeyError):
        build(graph, replacements={"no_such_task": first.func})


def test_rel_err():
    a = np.array([1.0, 2.0], np.float32)
    assert rel_err(a, a) == 0.0
    assert rel_err(a * 1.01, a) == pytest.approx(0.01, rel=1e-3)
    with pytest.raises(ValueError):
        max_rel_err([a], [a, a])


@pytest.mark.slow
def test_export_and_reload(small, tmp_path: Path):
    import tvm
    from tvm import relax

    model, graph = small
    built = build(graph)
    lib = tmp_path / "net.so"
    built.executable.export_library(str(lib))
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), tvm.cpu())
    x = model.random_inputs(0)
    out = vm["main"](tvm.runtime.tensor(x[0]))
    assert rel_err(out[0].numpy(), model.reference(x)[0]) < 1e-5
