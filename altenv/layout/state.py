"""A layout as a fixed-length vector: the state of one tensor that ALT's layout actor sees
(§5.2.1), so that one policy reads the layouts of operators of any shape."""

from __future__ import annotations

import math

import numpy as np

from .layout import Layout
from .primitives import Reorder, Split, Unfold


def tensor_state(layout: Layout, slots: int) -> np.ndarray:
    """ALT §5.2.1 state of one tensor at a fixed length: for each logical dim, the parts
    its split/unfold primitives made (outer first, innermost last; an untouched dim is
    ``[D, 1, ...]``), ``slots`` entries, each ``log(part) / log(D)``. Reorders are fixed
    by the template and carry no state."""
    parts = [[n] for n in layout.logical_shape]
    where = [(d, 0) for d in range(len(parts))]  # physical dim -> (logical dim, part)
    for prim in layout.primitives:
        if isinstance(prim, Reorder):
            where = [where[i] for i in prim.perm]
            continue
        if isinstance(prim, Split):
            new = list(prim.factors)
        elif isinstance(prim, Unfold):
            new = [prim.tiles, prim.tile]
        else:
            raise ValueError(f"layout state: {prim.name} is not a template primitive")
        d, j = where[prim.dim]
        parts[d][j:j + 1] = new
        where = [(e, k + len(new) - 1 if e == d and k > j else k) for e, k in where]
        where[prim.dim:prim.dim + 1] = [(d, j + i) for i in range(len(new))]
    state = []
    for extent, p in zip(layout.logical_shape, parts):
        if len(p) > slots:
            raise ValueError(f"layout state: a dim split into {len(p)} parts, {slots} slots")
        scale = math.log(extent) if extent > 1 else 1.0
        state += [math.log(v) / scale for v in [p[0]] + [1] * (slots - len(p)) + p[1:]]
    return np.clip(np.asarray(state, dtype=np.float32), 0.0, 1.0)
