"""Random legal layouts: random primitive sequences over a tensor, for tests and exploration."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .layout import Layout


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def random_layout(shape: Sequence[int], rng: np.random.Generator, steps: int = 3,
                  advanced: bool = True, names: Sequence[str] | None = None) -> Layout:
    """A layout of ``shape`` made of ``steps`` random legal primitives.

    Splits use divisors, fuses consecutive dims, reorders random permutations; with
    ``advanced`` also unfolds (stride <= tile) and pads.
    """
    layout = Layout(shape, names)
    kinds = ["split", "reorder", "fuse"] + (["unfold", "pad"] if advanced else [])
    for _ in range(steps):
        kind = kinds[rng.integers(len(kinds))]
        dim = int(rng.integers(layout.ndim))
        size = layout.shape[dim]
        if kind == "split" and size > 1:
            f = int(rng.choice(_divisors(size)))
            layout = layout.split(dim, [-1, f])
        elif kind == "reorder" and layout.ndim > 1:
            layout = layout.reorder([int(p) for p in rng.permutation(layout.ndim)])
        elif kind == "fuse" and dim + 1 < layout.ndim:
            layout = layout.fuse([dim, dim + 1])
        elif kind == "unfold" and size > 1:
            tile = int(rng.integers(1, size + 1))
            layout = layout.unfold(dim, tile, int(rng.integers(1, tile + 1)))
        elif kind == "pad":
            layout = layout.pad(dim, int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    return layout
