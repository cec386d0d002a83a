"""Zoo models at small size: import, expected complex ops in the task graph, numerics."""

from __future__ import annotations

from collections import Counter

import pytest

from altenv.graph import build, extract_tasks, load_model, max_rel_err
from altenv.graph.plan import plan_network
from altenv.graph.zoo import ZOO, get_model

SLOW = pytest.mark.slow
# model -> expected count of complex calls per kind
EXPECTED = {
    "resnet18": {"c2d": 20, "gmm": 1},
    "mobilenet_v2": {"c2d": 35, "dep": 17, "gmm": 1},
    "bert_tiny": {"gmm": 17},
    "r3d_18": {"c3d": 20, "gmm": 1},
    "dcgan": {"t2d": 5},
    "mobilenet_v3_small": {"c2d": 41, "dep": 11, "gmm": 2},
    "efficientnet_b0": {"c2d": 65, "dep": 16, "gmm": 1},
    "shufflenet_v2": {"c2d": 37, "dep": 19, "gmm": 1},
}
PARAMS = [pytest.param("bert_tiny"), pytest.param("dcgan")] + [
    pytest.param(name, marks=SLOW) for name in EXPECTED if name not in ("bert_tiny", "dcgan")]
BUILT = ["resnet18", "mobilenet_v2", "bert_tiny", "r3d_18", "dcgan"]  # the others: too slow
_CACHE: dict = {}


def _imported(name: str):
    if name not in _CACHE:
        model = load_model(name, size="small")
        _CACHE[name] = (model, extract_tasks(model))
    return _CACHE[name]


@pytest.mark.parametrize("name", PARAMS)
def test_task_graph_lists_expected_complex_ops(name: str):
    model, graph = _imported(name)
    kinds = Counter(c.op.kind for c in graph.complex_calls())
    assert dict(kinds) == EXPECTED[name]
    order = [c.index for c in graph.calls]
    assert order == list(range(len(graph.calls)))
    assert all(e.src < e.dst for e in graph.edges)  # topological
    assert sum(t.calls for t in graph.tasks.values()) == len(graph.calls)
    assert model.inputs[0].shape == ZOO[name].input_shapes["small"][0]
    # squeeze-excite, channel split and shuffle, transposed convs: all tuned with layouts
    assert not plan_network(graph).fallbacks
    # every norm and activation fused into its convolution's task: no elementwise task is
    # a convolution's only consumer and reads nothing else computed (a squeeze-excite
    # gate's product PrimFunc also scales a batch norm's output: marking it once cut 47
    # of EfficientNet-B0's off)
    consumers = Counter(e.src for e in graph.edges)
    for call in graph.calls:
        sources = [a.ref for a in call.args if a.kind == "call"]
        producer = graph.calls[sources[0]].op if len(sources) == 1 else None
        assert not (graph.tasks[call.task].kind == "elemwise" and producer is not None and
                    producer.kind != "gmm" and consumers[sources[0]] == 1), \
            f"{call.task} (call {call.index}) is not fused into call {sources[0]}"


@SLOW
def test_resnet_specs_include_downsample():
    _, graph = _imported("resnet18")
    specs = graph.specs()
    assert specs[0] == "c2d:N=1,I=3,H=32,W=32,O=16,KH=7,KW=7,stride=2,pad=3"
    assert "c2d:N=1,I=16,H=8,W=8,O=32,KH=1,KW=1,stride=2,pad=0" in specs


def test_bert_batch_matmuls():
    _, graph = _imported("bert_tiny")
    specs = graph.specs()
    assert specs.count("gmm:M=16,N=16,K=64,batch=2") == 2  # Q K^T, one per layer
    assert specs.count("gmm:M=16,N=64,K=16,batch=2") == 2  # P V
    assert specs.count("gmm:M=16,N=512,K=128") == 2  # FFN in


@SLOW
@pytest.mark.parametrize("name", BUILT)
def test_default_build_matches_torch(name: str):
    model, graph = _imported(name)
    x = model.random_inputs(seed=1)
    assert max_rel_err(build(graph).run(x), model.reference(x)) < 1e-4


def test_zoo_weights_and_seed(tmp_path):
    import torch

    a, _ = get_model("resnet18", size="small", seed=1)
    b, _ = get_model("resnet18", size="small", seed=2)
    path = tmp_path / "w.pt"
    torch.save(a.state_dict(), path)
    c, _ = get_model("resnet18", size="small", seed=2, weights=path)
    w = "stem.0.weight"
    assert not torch.equal(a.state_dict()[w], b.state_dict()[w])
    assert torch.equal(a.state_dict()[w], c.state_dict()[w])


def test_zoo_sizes_and_options():
    _, full = get_model("bert_tiny", size="full")
    assert tuple(full[0].shape) == (1, 128)
    _, long = get_model("bert_tiny", input_shapes=[(2, 32)])
    assert tuple(long[0].shape) == (2, 32) and int(long[0].min()) >= 1
    net, _ = get_model("mobilenet_v2", size="small", width=0.5)
    assert net.features[0].out_channels == 16
    with pytest.raises(KeyError, match="unknown model"):
        get_model("vgg16")
    assert load_model("dcgan", size="small", batch=3).inputs[0].shape == (3, 16, 1, 1)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        load_model("dcgan", size="small", batch=0)
