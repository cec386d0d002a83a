"""From a mapping to layouts: the tensor and reduction layouts that put the intrinsic
innermost (AMOS §5.1's physical mapping, expressed with ALT's layout primitives).

For a dot-product intrinsic ``dst[i] += src1[r] * src2[i, r]`` (``I`` lanes, ``R``
reduction) and a mapping ``i <- G_i``, ``r <- G_r``:

* ``out``: the loops of ``G_i`` fused and split ``(|G_i| / I, I)``, the lanes innermost
  (C2D with ``i <- o``: ``N O/8 H W 8``);
* ``weight``: ``G_i / I``, the other dims, ``G_r / R``, then ``I R`` innermost (``i <- o``,
  ``r <- rc``: ``O/8 KH KW I/4 8 4``);
* ``data``: a kernel loop of ``G_r`` reads a sliding window, so its spatial dim is first
  unfolded into (output position, window) — im2col along that dim (ALT's ``unfold``);
  then the dims of ``G_r`` are fused, padded and split ``(|G_r| / R, R)`` innermost;
* the reduction domain gets the same fuse, pad and split, so the program's innermost
  reduction loop is the intrinsic's ``r``.

Fused extents of ``G_r`` are padded with zeros up to a multiple of ``R`` (AMOS's trailing
padding); ``G_i`` must divide into lanes. Supported: convolutions without groups (c1d,
c2d, c3d, dil; kernel loops in ``G_r`` only without dilation) and GMM.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..layout import Layout
from ..ops import operator_for
from ..ops.operators import Conv, MatMul
from ..ops.workload import Workload
from .base import Intrinsic, Mapping
from .intrinsics import INTRINSICS
from .nest import loop_nest


@dataclass(frozen=True)
class Realization:
    """The layouts of a mapping: ``layouts`` for ``data``, ``weight``, ``out`` and
    ``reduce`` for the reduction domain (``altenv.ops.generate(..., reduce=)``)."""

    layouts: dict[str, Layout]
    reduce: Layout


def _pack(layout: Layout, dims: list[int], tile: int) -> Layout:
    """Move ``dims`` (in that order) to the end, fuse them, pad to a multiple of ``tile``
    and split off ``tile`` innermost."""
    rest = [d for d in range(layout.ndim) if d not in dims]
    if rest + dims != list(range(layout.ndim)):
        layout = layout.reorder(rest + dims)
    last = layout.ndim - 1
    if len(dims) > 1:
        layout = layout.fuse(list(range(layout.ndim - len(dims), layout.ndim)))
        last = layout.ndim - 1
    pad = -layout.shape[last] % tile
    if pad:
        layout = layout.pad(last, 0, pad)
    return layout.split(last, [-1, tile])


def _positions(op: Conv | MatMul) -> dict[str, dict[str, int]]:
    """For each tensor (and ``reduce``), the logical dim each loop indexes directly."""
    if isinstance(op, MatMul):
        return {"out": {"m": 0, "n": 1}, "data": {"m": 0, "rk": 1},
                "weight": {"rk": 0, "n": 1}, "reduce": {"rk": 0}}
    spatial = [s.lower() for s in op.names["out"][2:]]
    kernel = [n for n, _ in op.reduce_extents()[1:]]
    return {"out": {"n": 0, "o": 1, **{s: 2 + j for j, s in enumerate(spatial)}},
            "data": {"n": 0, "rc": 1},
            "weight": {"o": 0, "rc": 1, **{k: 2 + j for j, k in enumerate(kernel)}},
            "reduce": {"rc": 0, **{k: 1 + j for j, k in enumerate(kernel)}}}


def realize(wl: Workload, mapping: Mapping) -> Realization:
    """The layouts that implement ``mapping`` (``ValueError`` where it cannot be
    generated here: another intrinsic shape, groups, dilated kernel loops on ``r``, or
    ``i`` not a multiple of the lanes)."""
    op = operator_for(wl)
    intrin: Intrinsic = INTRINSICS[mapping.intrinsic]
    if tuple(intrin.operands.items()) != (("dst", ("i",)), ("src1", ("r",)),
                                          ("src2", ("i", "r"))):
        raise ValueError(f"realize: code generation covers the dot-product intrinsics "
                         f"(dst[i] += src1[r] * src2[i, r]), not {intrin.name}")
    if not isinstance(op, MatMul) and not (isinstance(op, Conv) and op.groups == 1):
        raise ValueError(f"realize: {wl.kind} with groups is not supported (c1d, c2d, c3d, "
                         "dil and gmm are)")
    mapping.check(loop_nest(wl), intrin)
    lanes, depth = intrin.extent("i"), intrin.extent("r")
    g_i, g_r = mapping.groups
    nest = loop_nest(wl)
    if mapping.fused_extent(nest, 0) % lanes:
        raise ValueError(f"realize: {mapping.describe()}: i fuses {mapping.fused_extent(nest, 0)}"
                         f" elements, not a multiple of {lanes} lanes")
    pos = _positions(op)
    shapes = op.input_shapes()
    names = op.names

    # data: unfold the spatial dims whose kernel loop is on r, then pack r innermost
    data = Layout(shapes["data"], names["data"])
    data_dim = dict(pos["data"])
    if isinstance(op, Conv):
        kernel = [n for n, _ in op.reduce_extents()[1:]]
        shift = 0
        for j, k in enumerate(kernel):
            if k not in g_r:
                continue
            if op.dilation[j] != 1:
                raise ValueError(f"realize: {mapping.describe()}: kernel loop {k} has dilation "
                                 f"{op.dilation[j]}; only undilated kernel loops fuse onto r")
            dim = 2 + j + shift
            data = data.unfold(dim, op.windows[j], op.stride[j])
            data_dim[k] = dim + 1
            shift += 1
    data = _pack(data, [data_dim[n] for n in g_r], depth)

    reduce = _pack(Layout([e for _, e in op.reduce_extents()], [n for n, _ in
                                                               op.reduce_extents()]),
                   [pos["reduce"][n] for n in g_r], depth)

    # weight: r packed, then i packed; order (i outer, rest, r outer, i lanes, r lanes)
    w_r = [pos["weight"][n] for n in g_r]
    kept = [d for d in range(len(shapes["weight"])) if d not in w_r]  # dims left in order
    weight = _pack(Layout(shapes["weight"], names["weight"]), w_r, depth)
    w_i = [kept.index(pos["weight"][n]) for n in g_i]
    rest = [d for d in range(len(kept)) if d not in w_i]
    weight = _pack(weight, w_i, lanes)
    n = weight.ndim  # [...rest', r/R, R, i/I, I]
    weight = weight.reorder([n - 2] + list(range(len(rest))) + [n - 4, n - 1, n - 3])

    # out: i packed; its outer part where the first i dim was, the lanes innermost
    out = Layout(op.out_shape(), names["out"])
    o_i = [pos["out"][n] for n in g_i]
    before = sum(1 for d in range(out.ndim) if d not in o_i and d < min(o_i))
    out = _pack(out, o_i, lanes)
    n = out.ndim
    order = list(range(before)) + [n - 2] + list(range(before, n - 2)) + [n - 1]
    if order != list(range(n)):
        out = out.reorder(order)
    return Realization({"data": data, "weight": weight, "out": out}, reduce)
