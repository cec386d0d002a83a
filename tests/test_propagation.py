"""ALT Alg. 1 layout propagation on small hand-made graphs."""

from __future__ import annotations

import pytest

from altenv.graph.propagation import COMPLEX, ELEMENTWISE, OTHER, Dataflow, OpNode, propagate
from altenv.layout import Layout

ACT = (1, 8, 6, 6)
PADDED = (1, 8, 8, 8)
W = (8, 8, 3, 3)


def tiled_out(shape=ACT):
    """N O/4 H W 4: basic primitives only."""
    return Layout(shape).split(1, [-1, 4]).reorder([0, 1, 3, 4, 2])


def padded_unfolded_data(shape=ACT):
    """A conv's input layout over the unpadded tensor: pad, then overlapped tiles."""
    return Layout(shape).pad(2, 1, 1).pad(3, 1, 1).unfold(2, 5, 3)


def conv(name, data, out, weight=None, extras=()):
    return OpNode(name, COMPLEX, (data, weight or f"{name}_w") + tuple(extras), out)


def graph(ops, extra_shapes=None, constants=()):
    shapes = {}
    for op in ops:
        for t in op.inputs + (op.output,):
            shapes[t] = W if t.endswith("_w") else ACT
    shapes.update(extra_shapes or {})
    consts = {t for t in shapes if t.endswith("_w")} | set(constants)
    return Dataflow(ops, shapes, frozenset(consts))


def test_conv_relu_add_conv():
    """conv1 -> relu -> add(., x) -> conv2: the tiled output propagates through relu; the
    add writes straight into conv2's input layout (Fig. 5b); no conversion is inserted."""
    g = graph([
        conv("conv1", "x", "c1"),
        OpNode("relu", ELEMENTWISE, ("c1",), "r"),
        OpNode("add", ELEMENTWISE, ("r", "x"), "a"),
        conv("conv2", "a", "c2"),
    ])
    out, data2 = tiled_out(), padded_unfolded_data()
    res = propagate(g, {"conv1": {"out": out}, "conv2": {"data": data2}})
    assert res.storage["c1"] == out
    assert res.storage["r"] == out            # propagated to the same-shape consumer
    assert res.storage["a"] == data2          # the add performs the conversion itself
    assert res.conversions == []
    assert res.read_layout("add", "x", g.shapes).is_identity()


def test_conv_conv_inserts_a_conversion():
    g = graph([conv("conv1", "x", "c1"), conv("conv2", "c1", "c2")])
    out, data2 = tiled_out(), padded_unfolded_data()
    res = propagate(g, {"conv1": {"out": out}, "conv2": {"data": data2}})
    convs = [c for c in res.conversions if c.consumer == "conv2"]
    assert len(convs) == 1 and convs[0].src == out and convs[0].dst == data2
    assert res.read_layout("conv2", "c1", g.shapes) == data2


def test_same_layout_needs_no_conversion():
    g = graph([conv("conv1", "x", "c1"), conv("conv2", "c1", "c2")])
    res = propagate(g, {"conv1": {"out": tiled_out()}, "conv2": {"data": tiled_out()}})
    assert not [c for c in res.conversions if c.consumer == "conv2"]


def test_advanced_primitives_are_converted_not_propagated():
    """Alg. 1 line 3: a sequence with a non-trivial unfold stops and converts."""
    g = graph([conv("conv1", "x", "c1"), OpNode("relu", ELEMENTWISE, ("c1",), "r"),
               OpNode("pool", OTHER, ("r",), "p")])
    unfolded = Layout(ACT).unfold(2, 4, 2)
    res = propagate(g, {"conv1": {"out": unfolded}})
    assert "r" not in res.storage
    convs = [c for c in res.conversions if c.consumer == "relu"]
    assert convs and convs[0].src == unfolded and convs[0].dst.is_identity()


def test_other_ops_read_logical_data():
    g = graph([conv("conv1", "x", "c1"), OpNode("relu", ELEMENTWISE, ("c1",), "r"),
               OpNode("pool", OTHER, ("r",), "p")])
    res = propagate(g, {"conv1": {"out": tiled_out()}})
    assert res.storage["r"] == tiled_out()
    convs = [c for c in res.conversions if c.consumer == "pool"]
    assert convs and convs[0].tensor == "r" and convs[0].dst.is_identity()


def test_shape_change_stops_propagation():
    g = graph([conv("conv1", "x", "c1"), OpNode("sum", ELEMENTWISE, ("c1",), "s")],
              extra_shapes={"s": (1, 8)})
    res = propagate(g, {"conv1": {"out": tiled_out()}})
    assert "s" not in res.storage


def test_two_producer_add_follows_the_first_input():
    """§6: both inputs tuned -> the first one's layout goes onto the output."""
    g = graph([conv("conv1", "x", "c1"), conv("conv2", "x", "c2"),
               OpNode("add", ELEMENTWISE, ("c1", "c2"), "a"),
               OpNode("relu", ELEMENTWISE, ("a",), "r")])
    l1 = tiled_out()
    l2 = Layout(ACT).reorder([0, 2, 3, 1])
    res = propagate(g, {"conv1": {"out": l1}, "conv2": {"out": l2}})
    assert res.storage["a"] == l1 and res.storage["r"] == l1
    assert res.read_layout("add", "c2", g.shapes) == l2  # read through its own layout


def test_two_producer_add_second_input_tuned_first():
    """Only the second input carries a layout: it still decides the output."""
    g = graph([OpNode("relu0", ELEMENTWISE, ("x",), "r0"), conv("conv1", "x", "c1"),
               OpNode("add", ELEMENTWISE, ("r0", "c1"), "a")])
    res = propagate(g, {"conv1": {"out": tiled_out()}})
    assert res.storage["a"] == tiled_out()


def test_residual_operand_is_written_in_the_output_layout():
    """§6 backwards: the output layout of a fused conv+add is handed to the residual's
    producers, which have no layout of their own yet."""
    g = graph([OpNode("relu0", ELEMENTWISE, ("x",), "r0"),
               OpNode("relu1", ELEMENTWISE, ("r0",), "r1"),
               conv("conv1", "y", "c1", extras=("r1",))])
    res = propagate(g, {"conv1": {"out": tiled_out()}})
    assert res.storage["r1"] == tiled_out() and res.storage["r0"] == tiled_out()
    assert res.read_layout("conv1", "r1", g.shapes) == tiled_out()


def test_weights_are_transformed_offline():
    g = graph([conv("conv1", "x", "c1")])
    w = Layout(W).split(0, [-1, 4]).reorder([0, 2, 3, 4, 1])
    res = propagate(g, {"conv1": {"weight": w}})
    assert res.weights == {"conv1_w": w}
    assert not [c for c in res.conversions if c.tensor == "conv1_w"]


def test_bad_graphs_are_rejected():
    with pytest.raises(ValueError, match="kind 'fancy'"):
        Dataflow([OpNode("a", "fancy", ("x",), "y")], {"x": (1,), "y": (1,)})
    with pytest.raises(ValueError, match="tensor 'y' has no shape"):
        Dataflow([OpNode("a", ELEMENTWISE, ("x",), "y")], {"x": (1,)})


def test_then_composes_pad_with_a_template_layout():
    tiles = Layout(PADDED).unfold(2, 5, 3).split(1, [-1, 4])
    composed = Layout(ACT).pad(2, 1, 1).pad(3, 1, 1).then(tiles)
    assert composed.shape == tiles.shape and composed.has_nontrivial_advanced()
    with pytest.raises(ValueError, match="not of this layout's physical shape"):
        Layout(ACT).then(tiles)
