"""Structural recognition of complex operators in fused tasks (no build, tiny shapes)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from altenv.graph import extract_tasks, load_model


def _graph(tmp_path: Path, body: str, inputs: str):
    """Import a module defined by ``body`` (its ``forward``) via a ``file.py:make`` factory."""
    src = ("import torch\nfrom torch import nn\nimport torch.nn.functional as F\n\n"
           "class M(nn.Module):\n" + textwrap.indent(textwrap.dedent(body), "    ")
           + f"\n\ndef make():\n    return M(), ({inputs},)\n")
    path = tmp_path / "model.py"
    path.write_text(src)
    return extract_tasks(load_model(f"{path}:make"))


CASES = [
    ("""
     def __init__(self):
         super().__init__()
         self.c = nn.Conv2d(4, 8, 3, stride=2, padding=1)
     def forward(self, x):
         return torch.relu(self.c(x))
     """, "torch.randn(1, 4, 9, 9)",
     ["c2d:N=1,I=4,H=9,W=9,O=8,KH=3,KW=3,stride=2,pad=1"]),
    ("""
     def __init__(self):
         super().__init__()
         self.g = nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False)
         self.d = nn.Conv2d(8, 8, 3, padding=1, groups=8)
         self.l = nn.Conv2d(8, 4, 3, padding=2, dilation=2)
     def forward(self, x):
         return self.l(self.d(self.g(x)))
     """, "torch.randn(2, 8, 6, 6)",
     ["grp:N=2,I=8,H=6,W=6,O=8,KH=3,KW=3,stride=1,pad=1,groups=4",
      "dep:N=2,C=8,H=6,W=6,KH=3,KW=3,stride=1,pad=1",
      "dil:N=2,I=8,H=6,W=6,O=4,KH=3,KW=3,stride=1,pad=2,dilation=2"]),
    ("""
     def __init__(self):
         super().__init__()
         self.c = nn.Conv1d(3, 5, 3, stride=2, padding=1)
     def forward(self, x):
         return self.c(x)
     """, "torch.randn(1, 3, 10)",
     ["c1d:N=1,I=3,W=10,O=5,KW=3,stride=2,pad=1"]),
    ("""
     def __init__(self):
         super().__init__()
         self.c = nn.Conv3d(3, 4, (3, 5, 5), stride=(1, 2, 2), padding=(1, 2, 2), bias=False)
     def forward(self, x):
         return self.c(x)
     """, "torch.randn(1, 3, 4, 8, 8)",
     ["c3d:N=1,I=3,D=4,H=8,W=8,O=4,KD=3,KH=5,KW=5,stride=1x2x2,pad=1x2x2"]),
    ("""
     def __init__(self):
         super().__init__()
         self.t = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
     def forward(self, x):
         return self.t(x)
     """, "torch.randn(1, 4, 5, 5)",
     ["t2d:N=1,I=4,H=5,W=5,O=6,KH=3,KW=3,stride=2,pad=1,opad=1"]),
    ("""
     def __init__(self):
         super().__init__()
         self.c = nn.Conv2d(3, 4, 3)
     def forward(self, x):
         return self.c(F.pad(x, (1, 1, 2, 2)))
     """, "torch.randn(1, 3, 6, 6)",
     ["c2d:N=1,I=3,H=6,W=6,O=4,KH=3,KW=3,stride=1,pad=2x1"]),
    ("""
     def __init__(self):
         super().__init__()
         self.fc = nn.Linear(32, 16)
     def forward(self, x, y):
         return torch.matmul(self.fc(x), y)
     """, "torch.randn(3, 8, 32), torch.randn(3, 16, 4)",
     ["gmm:M=24,N=16,K=32", "gmm:M=8,N=4,K=16,batch=3"]),
]


@pytest.mark.parametrize("body,inputs,specs", CASES,
                         ids=["c2d", "grp-dep-dil", "c1d", "c3d", "t2d", "pad-task", "gmm"])
def test_complex_ops_recognised(tmp_path: Path, body: str, inputs: str, specs: list[str]):
    assert _graph(tmp_path, body, inputs).specs() == specs


def test_epilogue_and_edges(tmp_path: Path):
    body = """
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(4, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, padding=1)
    def forward(self, x):
        y = torch.relu(self.a(x))
        return torch.clamp(self.b(y) + y, 0, 6)
    """
    g = _graph(tmp_path, body, "torch.randn(1, 4, 6, 6)")
    first, second = g.complex_calls()
    assert g.tasks[first.task].analysis.epilogue == ["bias_add", "relu"]
    assert g.tasks[second.task].analysis.epilogue == ["bias_add", "add", "clip"]
    assert g.tasks[first.task].analysis.prologue == ["pad"]
    # the second task reads the first one's output once, as conv data and as residual
    assert [(e.src, e.arg) for e in g.producers(second.index)] == [(first.index, 0)]
    assert g.outputs == [second.index]
    assert first.args[0].kind == "input" and first.args[1].kind == "const"


def test_structurally_equal_tasks_are_merged(tmp_path: Path):
    body = """
    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList(nn.Conv2d(4, 4, 3, padding=1) for _ in range(3))
    def forward(self, x):
        for c in self.convs:
            x = torch.relu(c(x))
        return x
    """
    g = _graph(tmp_path, body, "torch.randn(1, 4, 6, 6)")
    (task,) = g.complex_tasks()
    assert task.calls == 3 and len(g.complex_calls()) == 3
    assert [c.index for c in g.calls] == [0, 1, 2]
    assert [(e.src, e.dst) for e in g.edges] == [(0, 1), (1, 2)]


def test_reductions_are_not_complex():
    g = extract_tasks(load_model("bert_tiny", size="small"))
    kinds = {t.kind for t in g.tasks.values()}
    assert "reduce" in kinds and "gmm" in kinds  # layer norm / softmax, matmuls
    assert all(t.op is None for t in g.tasks.values() if t.kind == "reduce")


@pytest.mark.parametrize("sections, sizes", [(3, [4, 4, 2]), (2, [5, 5]), ([3, 7], [3, 4, 3])])
def test_split_becomes_one_slice_per_part_as_relax_sizes_them(sections, sizes):
    """A split rewritten into slices keeps Relax's part sizes (ceil-sized sections, the
    last smaller; or explicit indices)."""
    from tvm import relax

    from altenv.graph.tasks import _SplitToSlices

    x = relax.Var("x", relax.TensorType((1, 10, 4, 4), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.split(x, sections, axis=1))
        bb.emit_func_output(out)
    split = bb.get()["main"]
    body = _SplitToSlices().visit_expr(split.body)
    assert [int(p.shape[1]) for p in body.body.ty.fields] == sizes
    assert [int(p.shape[1]) for p in split.ret_ty.fields] == sizes  # Relax's own sizes
