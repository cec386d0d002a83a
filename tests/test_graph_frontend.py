"""Model import: ONNX files, ``file.py:factory`` references, unsupported operators, hashes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from altenv.graph import UnsupportedOperatorError, build, extract_tasks, load_model, rel_err


def _onnx_model(path: Path, op: str = "Relu") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gemm -> op -> Add(bias) made with the onnx helper API; returns its weights."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((6, 4)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    c = rng.standard_normal(6).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
        helper.make_node(op, ["h"], ["r"]),
        helper.make_node("Add", ["r", "c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 6])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
         numpy_helper.from_array(c, "c")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return w, b, c


def test_onnx_import_matches_numpy(tmp_path: Path):
    path = tmp_path / "tiny.onnx"
    w, b, c = _onnx_model(path)
    model = load_model(path)
    assert model.torch_module is None and model.name == "tiny"
    assert [(i.name, i.shape, i.dtype) for i in model.inputs] == [("x", (3, 4), "float32")]
    assert len(model.params) == 3
    graph = extract_tasks(model)
    assert graph.specs() == ["gmm:M=3,N=6,K=4"]
    x = model.random_inputs(0)[0]
    expected = np.maximum(x @ w.T + b, 0) + c
    assert rel_err(build(graph).run([x])[0], expected) < 1e-5


def test_onnx_unsupported_op_is_named(tmp_path: Path):
    path = tmp_path / "bad.onnx"
    _onnx_model(path, op="Det")
    with pytest.raises(UnsupportedOperatorError, match="Det") as info:
        load_model(path)
    assert info.value.ops == ["Det"]


def test_torch_unsupported_op_is_named(tmp_path: Path):
    path = tmp_path / "bad.py"
    path.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.special.bessel_j0(x) + 1\n"
        "def make():\n"
        "    return M(), (torch.randn(2, 3),)\n"
    )
    with pytest.raises(UnsupportedOperatorError, match="bessel_j0"):
        load_model(f"{path}:make")


FACTORY = (
    "import torch\n"
    "def make():\n"
    "    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh())\n"
    "    return net, torch.randn(2, 8)\n"
)


def test_factory_import_and_input_shapes(tmp_path: Path):
    path = tmp_path / "fac.py"
    path.write_text(FACTORY)
    model = load_model(f"{path}:make")
    assert model.inputs[0].shape == (2, 8) and model.torch_module is not None
    resized = load_model(f"{path}:make", input_shapes=[(5, 8)])
    assert resized.inputs[0].shape == (5, 8)
    assert resized.source_hash != model.source_hash
    assert load_model(f"{path}:make").source_hash == model.source_hash
    x = model.random_inputs(0)
    out = build(extract_tasks(model)).run(x)
    assert rel_err(out[0], model.reference(x)[0]) < 1e-5


def test_weights_file_changes_params_and_hash(tmp_path: Path):
    import torch

    path = tmp_path / "fac.py"
    path.write_text(FACTORY)
    base = load_model(f"{path}:make")
    state = {k: torch.full_like(v, 0.5) for k, v in base.torch_module.state_dict().items()}
    wpath = tmp_path / "w.pt"
    torch.save(state, wpath)
    loaded = load_model(f"{path}:make", weights=wpath)
    assert all(np.all(v == 0.5) for v in loaded.params.values())
    assert loaded.source_hash != base.source_hash


def test_bad_sources(tmp_path: Path):
    with pytest.raises(ValueError, match="cannot interpret"):
        load_model("not_a_model")
    with pytest.raises(ValueError, match="weights"):
        load_model(tmp_path / "x.onnx", weights="w.pt")
