"""A fixed-length description of a workload, for policies that serve many operators.

A layout's state (its split factors and the extents they tile) says little about the
operator behind it: a 3x3 and a 7x7 convolution, strided or dilated, grouped or not, look
alike. A policy pretrained across workloads needs the rest: the operator kind, batch,
channels, spatial sizes, kernel window, stride, dilation, groups, dtype, and the work
and arithmetic intensity that decide whether it is compute- or memory-bound.
"""

from __future__ import annotations

import math

import numpy as np

from .operators import operator_for
from .workload import KINDS, Workload

WORKLOAD_FEATURES = len(KINDS) + 17
"""Length of :func:`workload_features`."""


def _log2(value: float, top: float) -> float:
    return min(math.log2(max(value, 1)) / top, 1.0)


def _max(value: int | tuple[int, ...] | None, default: int = 1) -> int:
    if value is None:
        return default
    return max(value) if isinstance(value, tuple) else int(value)


def workload_features(workload: Workload) -> np.ndarray:
    """``float32`` values in [0, 1]: the kind (one-hot), then ``log2`` scaled batch, input
    and output channels (a GEMM's K and N), depth, height, width and GEMM rows, the
    kernel window (depth, height, width, /7), stride and dilation (/4), groups, whether
    the dtype is int8 or float16, ``log2`` of the FLOPs and of the arithmetic intensity."""
    wl = workload
    p = wl.params
    op = operator_for(wl)
    kind = np.zeros(len(KINDS), dtype=np.float32)
    kind[KINDS.index(wl.kind)] = 1.0
    if wl.kind == "gmm":
        batch, inp, out, rows = _max(p.get("batch")), p["K"], p["N"], p["M"]
        depth = height = width = 0
    else:
        batch, rows = _max(p.get("N")), 0
        inp = p["C"] if wl.kind == "dep" else p["I"]
        out = p["C"] if wl.kind == "dep" else p["O"]
        depth, height, width = (_max(p.get(k), 0) for k in ("D", "H", "W"))
    kernel = [min(_max(p.get(k), 0) / 7.0, 1.0) for k in ("KD", "KH", "KW")]
    flops, moved = float(op.flops()), float(op.traffic_bytes())
    rest = [
        _log2(batch, 4), _log2(inp, 11), _log2(out, 11), _log2(depth, 8), _log2(height, 8),
        _log2(width, 11), _log2(rows, 11), *kernel,
        min(_max(p.get("stride")) / 4.0, 1.0), min(_max(p.get("dilation")) / 4.0, 1.0),
        _log2(_max(p.get("groups")), 6), float(wl.dtype == "int8"),
        float(wl.dtype == "float16"), _log2(flops, 40), _log2(flops / max(moved, 1.0), 10),
    ]
    return np.concatenate([kind, np.asarray(rest, dtype=np.float32)])
